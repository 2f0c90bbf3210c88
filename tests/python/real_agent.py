"""The real agent (hermes-agent from PyPI) through a mount over its home.

Run with the agent's own interpreter (a venv holding hermes-agent) and
HERMES_HOME set to the mount point; HERMES_BUNDLED_SKILLS names a directory
of bundled skills outside the mount. Drives the agent's own code:
tools.skills_sync.sync_skills (twice, the second an update of a bundled
skill: its .bak dance), tools.skill_manager_tool.skill_manage (create,
patch, write_file, delete), agent.curator_backup (snapshot, then rollback),
its loader agent.skill_utils.iter_skill_index_files, and its session
database hermes_state.SessionDB (SQLite in WAL mode in the home).

Prints one JSON line of what it saw; asserts the agent's own answers.
"""

import json
import os
import sys
from pathlib import Path

HOME = Path(os.environ["HERMES_HOME"])
SKILLS = HOME / "skills"
BUNDLED = Path(os.environ["HERMES_BUNDLED_SKILLS"])

from agent import curator_backup  # noqa: E402
from agent.skill_utils import iter_skill_index_files  # noqa: E402
from hermes_state import SessionDB  # noqa: E402
from tools.skill_manager_tool import skill_manage  # noqa: E402
from tools.skills_sync import sync_skills  # noqa: E402


def loaded():
    return sorted(str(p.parent.relative_to(SKILLS)) for p in iter_skill_index_files(SKILLS, "SKILL.md"))


def ok(answer):
    data = json.loads(answer)
    assert data.get("success"), answer
    return data


seen = {}
# Bundled skills land in skills/ (the agent's first run).
r = sync_skills(quiet=True)
seen["sync1"] = {k: v for k, v in r.items() if isinstance(v, (int, list))}
seen["after_sync"] = loaded()
assert "research/arxiv" in seen["after_sync"], seen

# A bundled skill updated upstream: the sync's update path.
(BUNDLED / "research" / "arxiv" / "SKILL.md").write_text(
    "---\nname: arxiv\ndescription: Search arXiv (v2)\n---\n# arXiv v2\n"
)
sync_skills(quiet=True)
assert "v2" in (SKILLS / "research" / "arxiv" / "SKILL.md").read_text()

# The agent writes its own skill.
body = "---\nname: my-notes\ndescription: Notes the agent keeps\n---\n# Notes\nfirst\n"
ok(skill_manage(action="create", name="my-notes", content=body, category="custom"))
ok(skill_manage(action="patch", name="my-notes", old_string="first", new_string="second"))
ok(skill_manage(action="write_file", name="my-notes", file_path="references/a.md", file_content="ref\n"))
assert "second" in (SKILLS / "custom" / "my-notes" / "SKILL.md").read_text()

# A curator snapshot, a change, and the curator's own rollback.
snap = curator_backup.snapshot_skills(reason="test")
assert snap is not None and (Path(snap) / "skills.tar.gz").exists(), snap
ok(skill_manage(action="patch", name="my-notes", old_string="second", new_string="third"))
done, msg, _ = curator_backup.rollback(Path(snap).name)
assert done, msg
assert "second" in (SKILLS / "custom" / "my-notes" / "SKILL.md").read_text()
seen["after_rollback"] = loaded()
assert seen["after_rollback"].count("custom/my-notes") == 1, seen

ok(skill_manage(action="delete", name="my-notes"))
seen["after_delete"] = loaded()
assert "custom/my-notes" not in seen["after_delete"]

# Its sessions, in the home beside skills/.
db = SessionDB(HOME / "state.db")
db.create_session("s1", "cli")
for i in range(50):
    db.append_message("s1", "user" if i % 2 == 0 else "assistant", content=f"message {i}")
seen["messages"] = len(db.get_messages("s1"))
db.close()
assert seen["messages"] == 50, seen
print(json.dumps(seen))

"""The real agent's delete of a category's last skill, for tests/it/agent.rs.

Run with the agent's own interpreter and HERMES_HOME set to the mount
point. `create` makes social/greet through skill_manage (SKILL.md, then
references/a.md and scripts/run.sh by write_file); `delete` deletes it by
skill_manage, whose delete removes the emptied category too (an rmtree of
the skill, then an rmdir of social/).
"""

import json
import os
import sys
from pathlib import Path

SKILLS = Path(os.environ["HERMES_HOME"]) / "skills"

from tools.skill_manager_tool import skill_manage  # noqa: E402


def ok(answer):
    data = json.loads(answer)
    assert data.get("success"), answer
    return data


if sys.argv[1] == "create":
    body = "---\nname: greet\ndescription: Greets people\n---\n# Greet\n"
    ok(skill_manage(action="create", name="greet", content=body, category="social"))
    ok(skill_manage(action="write_file", name="greet", file_path="references/a.md", file_content="ref\n"))
    ok(skill_manage(action="write_file", name="greet", file_path="scripts/run.sh", file_content="#!/bin/sh\necho hi\n"))
    assert (SKILLS / "social" / "greet" / "scripts" / "run.sh").is_file()
else:
    ok(skill_manage(action="delete", name="greet"))
    assert not (SKILLS / "social").exists(), "the agent left the emptied category"

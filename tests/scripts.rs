//! The mount scripts: idempotent mount and unmount over $HERMES_HOME/skills.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{Scratch, describe, is_mounted, lazy_unmount};

struct Detach(PathBuf);
impl Drop for Detach {
    fn drop(&mut self) {
        if is_mounted(&self.0) {
            lazy_unmount(&self.0);
        }
    }
}

fn script(name: &str, hermes_home: &Path) -> Output {
    Command::new(format!(
        "{}/mount-scripts/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .env("HERMES_HOME", hermes_home)
    .env("SKILLFS_BIN", common::BIN)
    .output()
    .unwrap()
}

#[test]
fn mount_scripts_are_idempotent_and_respect_hermes_home() {
    let s = Scratch::new("scripts");
    let home = s.dir.join("hermes");
    let root = home.join("skills");
    let _guard = Detach(root.clone());
    // The skills directory is created when missing.
    let out = script("skillfs-mount", &home);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(is_mounted(&root));
    let out = script("skillfs-mount", &home);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("already mounted"));
    std::fs::write(root.join("x.md"), "x").unwrap();
    assert!(
        home.join(".skillfs/skills/journal").is_dir(),
        "default store beside the root"
    );
    let out = script("skillfs-umount", &home);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(!is_mounted(&root));
    let out = script("skillfs-umount", &home);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("not mounted"));
    assert_eq!(std::fs::read(root.join("x.md")).unwrap(), b"x");
}

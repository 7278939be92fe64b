//! Crash safety: `zerohop checkpoint save` killed with SIGKILL at random
//! points (a child process, many times) never damages the previous
//! checkpoint, and leaves either no new checkpoint or a complete one.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

fn zerohop() -> Command {
    Command::new(env!("CARGO_BIN_EXE_zerohop"))
}

fn ok(cmd: &mut Command) {
    let out = cmd.output().expect("zerohop runs");
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn verifies(dir: &Path) -> bool {
    zerohop()
        .args(["checkpoint", "verify"])
        .arg(dir)
        .stdout(Stdio::null())
        .status()
        .unwrap()
        .success()
}

fn save_cmd(model: &Path, dir: &Path, parent: Option<&Path>) -> Command {
    let mut c = zerohop();
    c.args([
        "checkpoint",
        "save",
        "--device",
        "host",
        "--threads",
        "2",
        "--from",
    ])
    .arg(model)
    .arg(dir)
    .stdout(Stdio::null())
    .stderr(Stdio::null());
    if let Some(p) = parent {
        c.arg("--parent").arg(p);
    }
    c
}

#[test]
fn sigkill_during_save_keeps_the_previous_checkpoint() {
    let root =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("crash-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    let model = root.join("m.safetensors");
    ok(zerohop().args(["gen", "--size", "24MiB"]).arg(&model));
    let mut good = root.join("step-0");
    let t = Instant::now();
    ok(&mut save_cmd(&model, &good, None));
    let full = t.elapsed();

    let mut rng = u64::from(std::process::id()) | 1;
    let (mut killed, mut finished) = (0, 0);
    for i in 1..=24 {
        let dir = root.join(format!("step-{i}"));
        // Alternate full and incremental saves.
        let parent = (i % 2 == 0).then_some(good.as_path());
        let mut child = save_cmd(&model, &dir, parent).spawn().unwrap();
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let delay = full.mul_f64((rng % 1000) as f64 / 1000.0 * 1.2);
        std::thread::sleep(delay);
        let _ = child.kill(); // SIGKILL
        let status = child.wait().unwrap();
        assert!(
            verifies(&good),
            "step {i}: previous checkpoint {} damaged",
            good.display()
        );
        if dir.exists() {
            assert!(
                verifies(&dir),
                "step {i}: {} exists but is incomplete",
                dir.display()
            );
            good = dir;
            finished += 1;
        } else {
            assert!(
                !status.success(),
                "step {i}: save reported success but left nothing"
            );
            killed += 1;
        }
    }
    assert!(
        killed > 0,
        "no save was ever interrupted ({finished} finished)"
    );

    // The next save cleans up what the killed ones left behind.
    ok(&mut save_cmd(&model, &root.join("last"), Some(&good)));
    let leftovers: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("zerohop-tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    eprintln!("{killed} saves killed mid-way, {finished} finished first");
    let _ = std::fs::remove_dir_all(&root);
}

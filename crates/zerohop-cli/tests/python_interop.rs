//! Interoperability with the `safetensors` Python package: files it writes
//! load, checkpoint and restore through zerohop; files zerohop writes (the
//! checkpoint's data files) load in it with the same tensors. Skipped,
//! saying so, where Python lacks `safetensors` and `numpy`; a failure instead
//! where the `CI` environment variable is set (CI runs this through
//! scripts/test.sh, whose .venv has both).

use std::path::{Path, PathBuf};
use std::process::Command;

fn python(script: &str, args: &[&Path]) -> Option<std::process::Output> {
    let probe = Command::new("python3")
        .args(["-c", "import safetensors, numpy"])
        .output()
        .ok()?;
    if !probe.status.success() {
        return None;
    }
    Some(
        Command::new("python3")
            .arg("-c")
            .arg(script)
            .args(args)
            .output()
            .unwrap(),
    )
}

fn zerohop(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_zerohop"))
        .args(args)
        .output()
        .unwrap()
}

const WRITE: &str = r#"
import sys, numpy as np
from safetensors.numpy import save_file
rng = np.random.default_rng(7)
t = {
    "w.f32": rng.standard_normal((333, 129)).astype(np.float32),
    "w.f16": rng.standard_normal((1000, 77)).astype(np.float16),
    "ids.i64": rng.integers(-2**40, 2**40, size=(4097,), dtype=np.int64),
    "mask.bool": rng.integers(0, 2, size=(3, 5, 7)).astype(np.bool_),
    "bytes.u8": rng.integers(0, 256, size=(1 << 20) + 3, dtype=np.uint8),
    "empty.f32": np.zeros((0, 8), dtype=np.float32),
}
save_file(t, sys.argv[1], metadata={"source": "python"})
"#;

/// Loads every data file of a checkpoint with the Python package and
/// compares each tensor (dtype, shape, values) with the original file.
const COMPARE: &str = r#"
import sys, glob, numpy as np
from safetensors.numpy import load_file
orig = load_file(sys.argv[1])
got = {}
for f in sorted(glob.glob(sys.argv[2] + "/data-*.safetensors")):
    got.update(load_file(f))
assert sorted(got) == sorted(orig), (sorted(got), sorted(orig))
for k, v in orig.items():
    assert got[k].dtype == v.dtype and got[k].shape == v.shape, k
    assert np.array_equal(got[k], v), k
print("python: %d tensors equal" % len(orig))
"#;

#[test]
fn safetensors_python_round_trips() {
    let root =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("py-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    let model = root.join("py.safetensors");
    let Some(out) = python(WRITE, &[&model]) else {
        let missing = "python3 with safetensors and numpy is not installed";
        assert!(
            std::env::var_os("CI").is_none(),
            "{missing}: CI must run this test, not skip it (run it through scripts/test.sh)"
        );
        eprintln!("skipped: {missing}");
        return;
    };
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let m = model.to_str().unwrap();

    // Python-written file -> zerohop load, checked against the file.
    let out = zerohop(&["load", m, "--device", "host", "--verify"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // -> zerohop checkpoint (zerohop-written safetensors) -> Python.
    let ck = root.join("ck");
    let c = ck.to_str().unwrap();
    let out = zerohop(&[
        "checkpoint",
        "save",
        "--device",
        "host",
        "--shards",
        "3",
        "--from",
        m,
        c,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = python(COMPARE, &[&model, &ck]).unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // And back: restore compared with the Python-written original.
    let out = zerohop(&[
        "checkpoint",
        "restore",
        "--device",
        "host",
        c,
        "--against",
        m,
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("contents match"),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&root);
}

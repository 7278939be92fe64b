//! `freeze` and `thaw` against a stand-in for CRIU (`fake-criu`, beside
//! this file), which records its arguments and fails on demand: the
//! steps, the manifest, the checks of the images, and every failure's
//! handling, on CPU processes (`sleep`) that hold no GPU state. The real
//! CRIU runs in the Python suite's `test_freeze.py` where it is installed.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;
use zerohop::ErrorKind;
use zerohop_process::freeze::{read_manifest, GpuHalf};
use zerohop_process::{freeze, thaw, CriuFlags, FreezeOptions, FreezeReport};

/// The fake is chosen and steered through the environment, which every
/// test of this binary shares: they take turns.
static ENV: Mutex<()> = Mutex::new(());

struct Case {
    _turn: MutexGuard<'static, ()>,
    dir: PathBuf,
}

impl Case {
    fn new(tag: &str) -> Case {
        let turn = ENV.lock().unwrap_or_else(|p| p.into_inner());
        let dir = std::env::temp_dir().join(format!("zerohop-freeze-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let fake = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake-criu");
        // Safe to change: the tests of this binary take turns under ENV,
        // and none leaves a thread behind that reads it.
        std::env::set_var("ZEROHOP_CRIU", &fake);
        std::env::set_var("FAKE_CRIU_LOG", dir.join("calls"));
        for v in [
            "FAKE_CRIU_FAIL",
            "FAKE_CRIU_VERSION",
            "FAKE_CRIU_RESTORE_PID",
            "FAKE_CRIU_NO_TRACK",
        ] {
            std::env::remove_var(v);
        }
        Case { _turn: turn, dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// CRIU's dumps so far, one line of arguments each.
    fn dumps(&self) -> Vec<String> {
        let dump = |c: &String| c.starts_with("dump ");
        self.calls().into_iter().filter(dump).collect()
    }

    /// CRIU's calls so far, one line of arguments each.
    fn calls(&self) -> Vec<String> {
        std::fs::read_to_string(self.path("calls"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }
}

impl Drop for Case {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn sleeper() -> Child {
    Command::new("sleep").arg("600").spawn().unwrap()
}

/// Whether `child` ended by SIGKILL (reaped here).
fn was_killed(child: &mut Child) -> bool {
    use std::os::unix::process::ExitStatusExt;
    child.wait().unwrap().signal() == Some(9)
}

fn still_runs(child: &mut Child) -> bool {
    child.try_wait().unwrap().is_none()
}

fn options() -> FreezeOptions {
    FreezeOptions {
        leave_running: false,
        parent: None,
        criu: CriuFlags::default(),
        lock_timeout: Duration::from_secs(5),
    }
}

#[test]
fn a_freeze_stops_the_process_and_a_thaw_restores_it_with_the_same_flags() {
    let case = Case::new("whole");
    let mut child = sleeper();
    let pid = child.id();
    let dir = case.path("frozen");
    let opts = FreezeOptions {
        criu: CriuFlags {
            shell_job: true,
            tcp_established: true,
            extra: vec!["--link-remap".into()],
            ..CriuFlags::default()
        },
        ..options()
    };
    let report = freeze(pid, &dir, &opts).unwrap();
    assert!(was_killed(&mut child), "CRIU's dump ends the process");
    assert_eq!(
        (report.pid, report.gpu, report.leave_running),
        (pid, GpuHalf::None, false)
    );
    let names: Vec<&str> = report.images.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, [format!("core-{pid}.img").as_str(), "pages-1.img"]);
    assert_eq!(
        report.image_bytes,
        3_000_000 + format!("core of {pid}\n").len() as u64
    );
    assert!(report.seconds.durable >= report.seconds.criu_dump);
    // The manifest on disk is the report.
    let manifest = read_manifest(&dir).unwrap();
    assert_eq!(manifest.images, report.images);
    let images = dir.join("images");
    let dump = format!(
        "dump -t {pid} -D {} -W {} -o dump.log --shell-job --tcp-established --link-remap",
        images.display(),
        dir.display()
    );
    assert_eq!(case.calls(), ["--version".to_string(), dump]);

    let back = thaw(&dir, &["--log-pid".into()]).unwrap();
    assert_eq!(
        (back.pid, back.gpu, back.gpu_bytes),
        (pid, GpuHalf::None, 0)
    );
    let restore = case.calls().pop().unwrap();
    let pidfile = std::path::absolute(dir.join("restored.pid")).unwrap();
    assert_eq!(
        restore,
        format!(
            "restore -D {} -W {} -o restore.log --restore-detached --pidfile {} --shell-job --tcp-established --link-remap --log-pid",
            images.display(),
            dir.display(),
            pidfile.display()
        )
    );
    // What the restore wrote into the images does not spoil a second thaw.
    thaw(&dir, &[]).unwrap();
}

/// A snapshot of a sleeping process into `first`, a thaw refused while it
/// runs, then a freeze of it into `second` naming the snapshot as parent.
struct Chain {
    first: PathBuf,
    second: PathBuf,
    snapshot: FreezeReport,
    frozen: FreezeReport,
}

fn snapshot_then_freeze(case: &Case) -> Chain {
    let mut child = sleeper();
    let pid = child.id();
    let first = case.path("first");
    let snap = FreezeOptions {
        leave_running: true,
        ..options()
    };
    let snapshot = freeze(pid, &first, &snap).unwrap();
    assert!(still_runs(&mut child) && snapshot.parent.is_none());
    // The process still runs under its pid: a thaw would meet it.
    let e = thaw(&first, &[]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::AlreadyExists, "{e}");
    assert!(
        e.to_string().contains(&format!("process {pid} exists")),
        "{e}"
    );
    let second = case.path("second");
    let incremental = FreezeOptions {
        parent: Some(first.clone()),
        ..options()
    };
    let frozen = freeze(pid, &second, &incremental).unwrap();
    assert!(was_killed(&mut child) && !frozen.track_mem);
    Chain {
        first,
        second,
        snapshot,
        frozen,
    }
}

#[test]
fn a_snapshot_runs_on_and_a_later_freeze_writes_only_what_changed() {
    let case = Case::new("snapshot");
    let Chain {
        first,
        second,
        snapshot,
        frozen,
    } = snapshot_then_freeze(&case);
    assert!(snapshot.track_mem);
    let dumps = case.dumps();
    assert!(
        dumps[0].ends_with("--leave-running --track-mem"),
        "{dumps:?}"
    );
    assert_eq!(frozen.parent.as_deref(), Some("../first"));
    assert!(
        dumps[1].ends_with("--prev-images-dir ../../first/images"),
        "{dumps:?}"
    );
    assert_eq!(
        std::fs::read_link(second.join("images/parent")).unwrap(),
        Path::new("../../first/images")
    );
    thaw(&second, &[]).unwrap();
    // A thaw reads the parent's images too: damage there is found.
    let pages = first.join("images/pages-1.img");
    let mut bytes = std::fs::read(&pages).unwrap();
    bytes[10] ^= 0xff;
    std::fs::write(&pages, &bytes).unwrap();
    let e = thaw(&second, &[]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Integrity);
    assert!(
        e.to_string()
            .contains("first/images/pages-1.img is damaged: bytes 0 to"),
        "{e}"
    );
    // A parent that is no snapshot is refused before anything runs.
    let mut other = sleeper();
    let e = freeze(
        other.id(),
        &case.path("third"),
        &FreezeOptions {
            parent: Some(second.clone()),
            ..options()
        },
    )
    .unwrap_err();
    assert!(e.to_string().contains("not of process"), "{e}");
    assert!(still_runs(&mut other) && !case.path("third").exists());
    other.kill().unwrap();
    other.wait().unwrap();
}

#[test]
fn a_failed_dump_leaves_the_process_running_and_no_directory() {
    let case = Case::new("dump-fails");
    let mut child = sleeper();
    std::env::set_var("FAKE_CRIU_FAIL", "dump");
    let dir = case.path("frozen");
    let e = freeze(child.id(), &dir, &options()).unwrap_err();
    assert!(e.to_string().contains("fake dump failure"), "{e}");
    assert!(e.to_string().contains("CRIU could not dump process"), "{e}");
    assert!(still_runs(&mut child));
    assert!(!dir.exists());
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn a_damaged_or_missing_image_is_named_and_nothing_is_restored() {
    let case = Case::new("damaged");
    let mut child = sleeper();
    let pid = child.id();
    let dir = case.path("frozen");
    freeze(pid, &dir, &options()).unwrap();
    assert!(was_killed(&mut child));
    let calls = case.calls().len();
    let pages = dir.join("images/pages-1.img");
    let good = std::fs::read(&pages).unwrap();
    let mut bad = good.clone();
    bad[2_999_999] ^= 1;
    std::fs::write(&pages, &bad).unwrap();
    let e = thaw(&dir, &[]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Integrity);
    assert!(
        e.to_string()
            .contains("pages-1.img is damaged: bytes 0 to 3000000"),
        "{e}"
    );
    std::fs::write(&pages, &good).unwrap();
    let core = dir.join(format!("images/core-{pid}.img"));
    std::fs::remove_file(&core).unwrap();
    let e = thaw(&dir, &[]).unwrap_err();
    assert!(e.to_string().contains(&format!("core-{pid}.img")), "{e}");
    // Only --version ran: CRIU never restored from damaged images.
    assert!(
        case.calls()[calls..].iter().all(|c| c == "--version"),
        "{:?}",
        case.calls()
    );
    // A freeze cut off before its manifest is no freeze.
    std::fs::remove_file(dir.join("FREEZE.json")).unwrap();
    let e = thaw(&dir, &[]).unwrap_err();
    assert!(e.to_string().contains("holds no finished freeze"), "{e}");
}

#[test]
fn a_failed_restore_or_a_stranger_restored_leaves_nothing_running() {
    let case = Case::new("restore-fails");
    let mut child = sleeper();
    let dir = case.path("frozen");
    freeze(child.id(), &dir, &options()).unwrap();
    assert!(was_killed(&mut child));
    std::env::set_var("FAKE_CRIU_FAIL", "restore");
    let e = thaw(&dir, &[]).unwrap_err();
    assert!(e.to_string().contains("fake restore failure"), "{e}");
    assert!(e.to_string().contains("restore.log"), "{e}");
    std::env::remove_var("FAKE_CRIU_FAIL");
    // CRIU reports another process than the frozen one: it is stopped.
    let mut stranger = sleeper();
    std::env::set_var("FAKE_CRIU_RESTORE_PID", stranger.id().to_string());
    let e = thaw(&dir, &[]).unwrap_err();
    assert!(e.to_string().contains("not the frozen process"), "{e}");
    assert!(
        e.to_string().contains("nothing is left half-restored"),
        "{e}"
    );
    assert!(was_killed(&mut stranger));
}

#[test]
fn bad_requests_are_refused_before_anything_is_touched() {
    let case = Case::new("refused");
    let mut child = sleeper();
    let pid = child.id();
    // An existing directory.
    let taken = case.path("taken");
    std::fs::create_dir(&taken).unwrap();
    let e = freeze(pid, &taken, &options()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::AlreadyExists);
    // No such process.
    let e = freeze(u32::MAX, &case.path("none"), &options()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound);
    // A CRIU too old, and none at all.
    std::env::set_var("FAKE_CRIU_VERSION", "3.17");
    let e = freeze(pid, &case.path("old"), &options()).unwrap_err();
    assert!(e.to_string().contains("older than 4.0"), "{e}");
    std::env::set_var("ZEROHOP_CRIU", "/nonexistent/criu");
    let e = freeze(pid, &case.path("gone"), &options()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound);
    assert!(e.to_string().contains("scripts/build-criu.sh"), "{e}");
    assert!(!case.path("old").exists() && !case.path("gone").exists());
    assert!(still_runs(&mut child));
    // Only --version ever ran.
    assert!(
        case.calls().iter().all(|c| c == "--version"),
        "{:?}",
        case.calls()
    );
    child.kill().unwrap();
    // A zombie (killed, not yet waited for) is not frozen.
    let stat = format!("/proc/{pid}/stat");
    while !std::fs::read_to_string(&stat).unwrap().contains(") Z ") {
        std::thread::sleep(Duration::from_millis(5));
    }
    std::env::remove_var("FAKE_CRIU_VERSION");
    let e = freeze(pid, &case.path("zombie"), &options()).unwrap_err();
    assert!(e.to_string().contains("zombie"), "{e}");
    child.wait().unwrap();
}

#[test]
fn without_tracked_memory_a_later_freeze_writes_every_page_again() {
    let case = Case::new("untracked");
    std::env::set_var("FAKE_CRIU_NO_TRACK", "1");
    let Chain {
        first,
        second,
        snapshot,
        frozen,
    } = snapshot_then_freeze(&case);
    assert!(!snapshot.track_mem);
    let dumps = case.dumps();
    assert!(dumps[0].ends_with("--leave-running"), "{dumps:?}");
    assert_eq!(frozen.parent, None, "the parent is not needed to thaw");
    assert!(!dumps[1].contains("--prev-images-dir"), "{dumps:?}");
    std::fs::remove_dir_all(&first).unwrap();
    assert!(!second.join("images/parent").exists());
    thaw(&second, &[]).unwrap();
}

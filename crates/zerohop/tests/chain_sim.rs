//! Reads chained into one pipeline run ([`ReadChain`]) on the simulated
//! device, whose copies land late: each read's owner is told once all its
//! bytes have landed, reads join a run under way, a chain whose run is
//! over takes no more, and a failed read leaves no read untold.

mod common;

use common::{pattern, write, TestDir};
use std::sync::{mpsc, Arc};
use std::time::Duration;
use zerohop::plan::TransferPlan;
use zerohop::staging::StagingConfig;
use zerohop::storage::{self, BackendKind, SourceFile};
use zerohop::testing::{Fault, FaultyBackend, SimConfig, SimDevice};
use zerohop::{
    Device, DirectIo, Engine, EngineConfig, ErrorKind, HotRoute, OnArrival, PlannedRead, ReadChain,
};

const FILE_BYTES: usize = 3 << 20;

/// What a read's owner was told: its index, whether it arrived (else the
/// error's kind), and whether its buffer held the file's bytes then.
type Told = (usize, Result<(), ErrorKind>, bool);

struct Setup {
    engine: Arc<Engine>,
    files: Arc<Vec<SourceFile>>,
    data: Arc<Vec<u8>>,
    told: mpsc::Sender<Told>,
    _dir: TestDir,
}

/// An engine of 4 workers over 64 KiB slots on a simulated device whose
/// copies wait up to 300 us, and a file of 3 MiB, read per `hot`.
fn setup(hot: HotRoute, faults: Vec<Fault>) -> (Setup, mpsc::Receiver<Told>) {
    let dir = TestDir::new("chain");
    let data = pattern(FILE_BYTES, 7);
    let path = write(&dir.path("f"), &data);
    let device: Arc<dyn Device> = Arc::new(SimDevice::new(SimConfig {
        max_copy_delay: Duration::from_micros(300),
        ..SimConfig::default()
    }));
    let config = EngineConfig {
        staging: StagingConfig {
            total_bytes: 8 << 16,
            slot_bytes: 1 << 16,
        },
        io_threads: 4,
        direct_io: DirectIo::Never,
        hot_route: hot,
        ..EngineConfig::default()
    };
    let backend = Arc::new(FaultyBackend::new(
        storage::backend(BackendKind::Pread).unwrap(),
        faults,
    ));
    let engine = Arc::new(Engine::with_backend(device, config, backend).unwrap());
    let files = Arc::new(Engine::open_files(&[path]).unwrap());
    let (told, heard) = mpsc::channel();
    let setup = Setup {
        engine,
        files,
        data: Arc::new(data),
        told,
        _dir: dir,
    };
    (setup, heard)
}

/// Read `k`: the first half of each of 40 pieces of 6 KiB from `k * 256
/// KiB` on (as a rank reads its rows of each tensor of a window), into one
/// buffer. Its owner checks the buffer when told.
fn read(s: &Setup, k: usize) -> Box<PlannedRead> {
    read_then(s, k, Box::new(|| ()))
}

/// As [`read`]; its owner runs `then` when told, before it returns.
fn read_then(s: &Setup, k: usize, then: Box<dyn FnOnce() + Send>) -> Box<PlannedRead> {
    let pieces: Vec<(u64, u64)> = (0..40)
        .map(|i| ((k * (256 << 10) + i * 6_144) as u64, 3_072))
        .collect();
    let len: u64 = pieces.iter().map(|p| p.1).sum();
    let device = s.engine.device().clone();
    let buf = device.alloc(len as usize).unwrap();
    let mut plan = TransferPlan::new();
    let mut expected = Vec::new();
    let mut at = 0;
    for &(offset, n) in &pieces {
        plan.add(&s.files[..], 0, offset, n, &buf, at).unwrap();
        expected.extend_from_slice(&s.data[offset as usize..(offset + n) as usize]);
        at += n;
    }
    let told = s.told.clone();
    let on_arrival: OnArrival = Box::new(move |outcome| {
        let mut got = vec![0u8; buf.len()];
        device.read_back(&buf, 0, &mut got).unwrap();
        let _ = told.send((k, outcome.map(drop).map_err(|e| e.kind()), got == expected));
        then();
    });
    s.engine.plan_chained(&s.files, plan, on_arrival).unwrap()
}

/// Waits for `n` reads' owners to be told; a read never told fails here.
fn hear(heard: &mpsc::Receiver<Told>, n: usize) -> Vec<Told> {
    let mut all: Vec<Told> = (0..n)
        .map(|_| {
            heard
                .recv_timeout(Duration::from_secs(60))
                .expect("a chained read's owner was never told")
        })
        .collect();
    all.sort_by_key(|t| t.0);
    assert!(heard.try_recv().is_err(), "an owner was told twice");
    all
}

fn run(s: &Setup, chain: &Arc<ReadChain>) -> std::thread::JoinHandle<()> {
    let (engine, chain) = (s.engine.clone(), chain.clone());
    std::thread::spawn(move || engine.run_chain(&chain))
}

/// Read `k`, and when its owner is told, read `k + 1` joins `chain`, up to
/// read `last`: told on a worker of the run, which is then not waiting for
/// more, so the run cannot be over.
fn read_joining(s: &Arc<Setup>, chain: &Arc<ReadChain>, k: usize, last: usize) -> Box<PlannedRead> {
    let (s2, chain2) = (s.clone(), chain.clone());
    read_then(
        s,
        k,
        Box::new(move || {
            if k < last {
                let next = read_joining(&s2, &chain2, k + 1, last);
                assert!(
                    chain2.join(next).is_ok(),
                    "read {} found the run over",
                    k + 1
                );
            }
        }),
    )
}

#[test]
fn reads_joined_before_and_during_a_run_each_arrive_whole_when_told() {
    for hot in [HotRoute::Mapped, HotRoute::Staged] {
        let (s, heard) = setup(hot, vec![]);
        let s = Arc::new(s);
        let chain = Arc::new(ReadChain::new(s.files.clone()));
        // Reads 0 and 1 are queued before the run starts; reads 2 - 8 join
        // it while it runs, each when the one before it is told.
        assert!(chain.join(read(&s, 0)).is_ok());
        assert!(chain.join(read_joining(&s, &chain, 1, 8)).is_ok());
        run(&s, &chain).join().unwrap();
        let all = hear(&heard, 9);
        for (k, t) in all.iter().enumerate() {
            assert_eq!(*t, (k, Ok(()), true), "{hot:?}");
        }
        // The run is over: a read is given back, for a chain of its own.
        let late = chain.join(read(&s, 9)).expect_err("the run is over");
        let again = Arc::new(ReadChain::new(s.files.clone()));
        assert!(again.join(late).is_ok());
        run(&s, &again).join().unwrap();
        assert_eq!(hear(&heard, 1), vec![(9, Ok(()), true)]);
    }
}

#[test]
fn a_failed_read_fails_its_run_and_every_read_is_told() {
    // Read 4 alone covers byte 1 MiB + 30 KiB, which fails to read.
    let (s, heard) = setup(
        HotRoute::Staged,
        vec![Fault::Eio {
            at: (1 << 20) + (30 << 10),
        }],
    );
    let chain = Arc::new(ReadChain::new(s.files.clone()));
    for k in 0..8 {
        assert!(chain.join(read(&s, k)).is_ok());
    }
    run(&s, &chain).join().unwrap();
    let all = hear(&heard, 8);
    assert_eq!(all[4].1, Err(ErrorKind::Io), "{all:?}");
    for t in &all {
        // Told it arrived only with every byte in place.
        assert!(t.1.is_err() || t.2, "{all:?}");
    }
    // The engine reads on: a chain that avoids the bad byte arrives whole.
    let chain = Arc::new(ReadChain::new(s.files.clone()));
    for k in [0, 8, 9] {
        assert!(chain.join(read(&s, k)).is_ok());
    }
    run(&s, &chain).join().unwrap();
    assert_eq!(
        hear(&heard, 3),
        vec![(0, Ok(()), true), (8, Ok(()), true), (9, Ok(()), true)]
    );
}

#[test]
#[should_panic(expected = "planned for")]
fn a_read_joins_only_a_chain_of_its_files() {
    let (s, _heard) = setup(HotRoute::Mapped, vec![]);
    let other = Arc::new(Engine::open_files(&[s._dir.path("f")]).unwrap());
    let _ = ReadChain::new(other).join(read(&s, 0));
}

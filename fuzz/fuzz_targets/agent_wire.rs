//! What the agent reads from its clients, on arbitrary bytes: control
//! messages and suspend requests (decoded or refused, never a panic; an
//! accepted one encodes back to itself), and a ring whose indices and
//! entries a hostile client wrote (corruption is detected; entries that
//! pass the checks lie inside the registered buffer).
#![no_main]

use libfuzzer_sys::fuzz_target;
use zerohop_wire::control::{decode_request, encode, handle_from_hex, Request};
use zerohop_wire::ring::{check_entry, ring_bytes, Ring};
use zerohop_wire::shm::SharedMemory;
use zerohop_wire::suspend::decode_suspend_request;

const ENTRIES: u32 = 8;
const BUFFER: u64 = 1 << 20;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, body)) = data.split_first() else { return };
    match mode % 3 {
        0 => {
            if let Ok(r) = decode_request(body) {
                assert_eq!(decode_request(&encode(&r)).unwrap(), r);
                if let Request::RegisterCudaIpc { handle, .. } = &r {
                    let _ = handle_from_hex(handle);
                }
            }
            return;
        }
        // What a process serving suspend requests reads.
        2 => {
            if let Ok(r) = decode_suspend_request(body) {
                assert_eq!(decode_suspend_request(&encode(&r)).unwrap(), r);
            }
            return;
        }
        _ => {}
    }
    let len = ring_bytes(ENTRIES);
    let client_mem = SharedMemory::create("fuzz-ring", len).unwrap();
    let agent_mem = SharedMemory::import(client_mem.file().try_clone().unwrap(), len).unwrap();
    let client = Ring::create(client_mem, ENTRIES).unwrap();
    // The hostile client scribbles over everything after the first line.
    let n = body.len().min(len - 64);
    // SAFETY: inside the mapping; nothing else uses it during the copy.
    unsafe { std::ptr::copy_nonoverlapping(body.as_ptr(), client.memory().as_ptr().add(64), n) };
    let Ok(mut agent) = Ring::attach(agent_mem, ENTRIES) else { return };
    for _ in 0..3 {
        match agent.take_submissions() {
            Err(_) => return,
            Ok(sqes) => {
                assert!(sqes.len() <= ENTRIES as usize);
                for s in sqes {
                    if check_entry(&s, |f| f < 4, |b| (b == 1).then_some(BUFFER)).is_ok() {
                        assert!(s.buf_id == 1 && s.file_id < 4);
                        assert!(s.buf_offset.checked_add(s.len).is_some_and(|e| e <= BUFFER));
                    }
                }
            }
        }
        if let Ok(room) = agent.completion_room() {
            assert!(room <= ENTRIES);
        }
    }
});

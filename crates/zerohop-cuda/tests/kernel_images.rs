//! The SASS embedded beside the XXH3 kernel's PTX must be built from that
//! PTX, and be machine code for the architecture each file's name says.
//! scripts/build-kernels.sh records the hashes of both in
//! kernels/xxh3.cubins.txt; a kernel edited without rerunning it fails here.

use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::path::PathBuf;

const SMS: [u32; 3] = [80, 90, 100];

fn read(name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("kernels")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn sha256(name: &str) -> String {
    Sha256::digest(read(name))
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The manifest's `key value` lines.
fn manifest() -> HashMap<String, String> {
    String::from_utf8(read("xxh3.cubins.txt"))
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once(' '))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn cubins_are_those_built_from_the_checked_in_ptx() {
    let m = manifest();
    assert_eq!(
        m["ptx-sha256"],
        sha256("xxh3.ptx"),
        "kernels/xxh3.ptx is not the PTX the cubins were built from: run scripts/build-kernels.sh"
    );
    assert!(m["ptxas"].contains("release"), "ptxas: {}", m["ptxas"]);
    for sm in SMS {
        assert_eq!(
            m[&format!("sm_{sm}-sha256")],
            sha256(&format!("xxh3.sm_{sm}.cubin")),
            "kernels/xxh3.sm_{sm}.cubin is not the one scripts/build-kernels.sh wrote"
        );
    }
}

/// The cubins are ELF64 files of machine EM_CUDA whose `e_flags` name the
/// SM, in one of two layouts told apart by the ELF ABI version
/// (`e_ident[EI_ABIVERSION]`), as ptxas 12.9 writes them:
/// - 7 (sm_80, sm_90; OS ABI 0x33): the SM in bits 0-7, the PTX's target
///   (sm_70) in bits 16-23, and flags between (0x500: 64-bit addresses,
///   unified texture mode): 0x460550 for sm_80, 0x46055a for sm_90.
/// - 8 (sm_100; OS ABI 0x41): the SM in bits 8-15: 0x6006402 for sm_100.
///
/// LLVM's BinaryFormat/ELF.h names them EF_CUDA_SM, EF_CUDA_VIRTUAL_SM and
/// EF_CUDA_SM_MASK / EF_CUDA_SM_OFFSET.
#[test]
fn each_cubin_is_sass_for_its_architecture() {
    const EM_CUDA: u16 = 190;
    for (sm, abi_version) in [(80, 7), (90, 7), (100, 8)] {
        let elf = read(&format!("xxh3.sm_{sm}.cubin"));
        let name = format!("xxh3.sm_{sm}.cubin");
        assert!(elf.len() > 64, "{name}: too short for an ELF header");
        assert_eq!(&elf[..4], b"\x7fELF", "{name}: not ELF");
        assert_eq!((elf[4], elf[5]), (2, 1), "{name}: not 64-bit little-endian");
        let machine = u16::from_le_bytes([elf[18], elf[19]]);
        assert_eq!(machine, EM_CUDA, "{name}: e_machine");
        let flags = u32::from_le_bytes(elf[48..52].try_into().unwrap());
        assert_eq!(elf[8], abi_version, "{name}: ELF ABI version");
        let (flag_sm, virtual_sm) = match abi_version {
            7 => (flags & 0xff, Some((flags >> 16) & 0xff)),
            _ => ((flags >> 8) & 0xff, None),
        };
        assert_eq!(flag_sm, sm, "{name}: e_flags {flags:#x}");
        if let Some(v) = virtual_sm {
            assert_eq!(
                v, 70,
                "{name}: e_flags {flags:#x}: built from PTX for sm_70"
            );
        }
    }
}

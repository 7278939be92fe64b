//! What zerohop's command-line programs (the shipped `zerohop` and the
//! developers' `zerohop-lab`) share: sizes on the command line, the
//! engine's flags, progress bars, synthetic models and raw I/O rates.

pub mod engine_args;
pub mod gen;
pub mod progress;
pub mod raw_io;
pub mod size;

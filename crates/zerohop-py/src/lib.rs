//! The native half of the `zerohop` Python package. The Python half (in
//! `python/zerohop`) turns tensors and arrays into `(address, bytes)` pairs
//! and allocates every result through the framework, so memory is always
//! owned by PyTorch or NumPy; this half runs the engine on those ranges with
//! the GIL released. Its functions take raw addresses and are private to
//! the package: the Python half guarantees each range is a live, contiguous
//! buffer of the named device that it keeps alive for the call.
#![deny(unsafe_op_in_unsafe_fn)]

mod agent;
mod checkpoint;
mod engines;
mod errors;
mod layout;
mod process;
mod progress;
mod read_ahead;
mod suspend;
mod transfers;

use pyo3::prelude::*;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // A debug build moves bytes several times slower: the package warns.
    m.add("DEBUG_BUILD", cfg!(debug_assertions))?;
    m.add(
        "IntegrityError",
        m.py().get_type::<errors::IntegrityError>(),
    )?;
    m.add_function(wrap_pyfunction!(engines::device_name, m)?)?;
    m.add_function(wrap_pyfunction!(engines::prepare, m)?)?;
    m.add_function(wrap_pyfunction!(engines::grow_descriptor_table, m)?)?;
    m.add_function(wrap_pyfunction!(transfers::info, m)?)?;
    m.add_function(wrap_pyfunction!(transfers::safetensors_header, m)?)?;
    m.add_function(wrap_pyfunction!(transfers::read, m)?)?;
    m.add_function(wrap_pyfunction!(layout::safetensors_layout, m)?)?;
    m.add_function(wrap_pyfunction!(layout::plan_blocks, m)?)?;
    m.add_function(wrap_pyfunction!(layout::pieces_of, m)?)?;
    m.add_class::<layout::Layout>()?;
    m.add_function(wrap_pyfunction!(read_ahead::read_queued, m)?)?;
    m.add_function(wrap_pyfunction!(transfers::expand_names, m)?)?;
    m.add_function(wrap_pyfunction!(transfers::object_stamp, m)?)?;
    m.add_function(wrap_pyfunction!(transfers::is_object, m)?)?;
    m.add_function(wrap_pyfunction!(transfers::write, m)?)?;
    m.add_function(wrap_pyfunction!(transfers::save_safetensors, m)?)?;
    m.add_function(wrap_pyfunction!(checkpoint::checkpoint_save, m)?)?;
    m.add_function(wrap_pyfunction!(checkpoint::checkpoint_open, m)?)?;
    m.add_class::<checkpoint::OpenedCheckpoint>()?;
    m.add_function(wrap_pyfunction!(checkpoint::checkpoint_verify, m)?)?;
    m.add_function(wrap_pyfunction!(checkpoint::checkpoint_list, m)?)?;
    m.add_function(wrap_pyfunction!(checkpoint::checkpoint_remove, m)?)?;
    m.add_function(wrap_pyfunction!(checkpoint::checksums, m)?)?;
    m.add_function(wrap_pyfunction!(process::freeze, m)?)?;
    m.add_function(wrap_pyfunction!(process::thaw, m)?)?;
    m.add_function(wrap_pyfunction!(suspend::heap_alloc, m)?)?;
    m.add_function(wrap_pyfunction!(suspend::heap_free, m)?)?;
    m.add_function(wrap_pyfunction!(suspend::heap_state, m)?)?;
    m.add_function(wrap_pyfunction!(suspend::heap_suspend, m)?)?;
    m.add_function(wrap_pyfunction!(suspend::heap_resume, m)?)?;
    m.add_function(wrap_pyfunction!(suspend::serve_suspend, m)?)?;
    m.add_function(wrap_pyfunction!(suspend::suspend_socket_path, m)?)?;
    m.add_class::<transfers::Sources>()?;
    m.add_class::<read_ahead::QueuedRead>()?;
    m.add_class::<suspend::SuspendServer>()?;
    m.add_class::<agent::AgentClient>()?;
    m.add_class::<agent::AgentHostBuffer>()?;
    m.add_class::<agent::AgentRing>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}

//! What the writer, the query engine and the compactor share in one process: the caches of
//! symbols, Parquet metadata and partial results, fresh segments' objects (`cache`), the
//! segments built and not yet registered (`unregistered`), and the frame namer (`names`).

pub(crate) mod cache;
pub mod names;
pub(crate) mod unregistered;

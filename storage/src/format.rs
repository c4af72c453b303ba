//! The bytes Kiln writes and reads: block and series metadata with the object footer (`meta`),
//! each entry's series labels (`series_labels`) and inverted series index (`series_index`),
//! the dataset's Parquet schema, rows and builder (`block`), the symbols section (`symbols`)
//! and rollups (`rollup`). No I/O here: no tokio, no object store.

pub mod block;
pub mod meta;
pub mod rollup;
pub mod series_index;
pub mod series_labels;
pub mod symbols;
pub mod tiers;

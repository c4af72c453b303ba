//! The write-ahead log's records, as the gateway makes them ([`kiln_otel::record`]), and what
//! the storage's logged shards replay them with (ADR 0018).

use std::sync::Arc;

use kiln_otel::model::NormalizedProfile;
pub use kiln_otel::record::{PprofPart, Record, RecordBody};

/// Decodes a record back into its write for the storage's replay.
#[derive(Debug, Default)]
pub struct Records;

impl Records {
    pub fn decoder() -> Arc<dyn kiln_storage::writer::RecordDecoder> {
        Arc::new(Self)
    }
}

impl kiln_storage::writer::RecordDecoder for Records {
    fn decode(&self, record: &[u8]) -> Result<(String, Vec<NormalizedProfile>), String> {
        let (tenant, record) = Record::decode(record)?;
        Ok((tenant, record.profiles()?))
    }
}

//! The Arrow IPC codec: the bytes rows take in a replicated append and in a
//! segment frame. One batch is one IPC stream — schema message, the batch's
//! dictionaries and record batch, the end-of-stream marker — byte for byte
//! what arrow's `StreamWriter` writes, so any IPC reader reads it. A stream
//! caches its schema message ([`Stream::ipc_schema`](crate::catalog::Stream::ipc_schema)),
//! so the hot path encodes only the batch.

use arrow::array::RecordBatch;
use arrow::ipc::writer::{
    write_message, DictionaryTracker, IpcDataGenerator, IpcWriteContext, IpcWriteOptions,
};

use crate::error::{Error, Result};

/// Arrow IPC stream bytes of one batch: the form rows take in a command and
/// in a segment.
pub fn encode_ipc(batch: &RecordBatch) -> Result<Vec<u8>> {
    encode_ipc_with(&ipc_schema_message(&batch.schema())?, batch)
}

/// The IPC schema message that opens a stream of batches of `schema`. A
/// stream keeps its own ([`Stream::ipc_schema`](crate::catalog::Stream::ipc_schema)), so an INSERT encodes
/// only its batch (the schema's flatbuffer was a third of the encoding).
pub fn ipc_schema_message(schema: &arrow::datatypes::Schema) -> Result<Vec<u8>> {
    let options = IpcWriteOptions::default();
    let mut tracker = DictionaryTracker::new(false);
    let encoded = IpcDataGenerator::default().schema_to_bytes_with_dictionary_tracker(
        schema,
        &mut tracker,
        &options,
    );
    let mut buf = Vec::new();
    write_message(&mut buf, encoded, &options)?;
    Ok(buf)
}

/// The Arrow IPC stream bytes of one batch — `schema_message` (the
/// batch's schema, from [`ipc_schema_message`]), the batch, the end
/// marker — exactly what a `StreamWriter` writes.
pub fn encode_ipc_with(schema_message: &[u8], batch: &RecordBatch) -> Result<Vec<u8>> {
    let options = IpcWriteOptions::default();
    let mut tracker = DictionaryTracker::new(false);
    let (dictionaries, encoded) = IpcDataGenerator::default().encode(
        batch,
        &mut tracker,
        &options,
        &mut IpcWriteContext::default(),
    )?;
    let mut buf = Vec::with_capacity(schema_message.len() + batch.get_array_memory_size() + 256);
    buf.extend_from_slice(schema_message);
    for d in dictionaries {
        write_message(&mut buf, d, &options)?;
    }
    write_message(&mut buf, encoded, &options)?;
    buf.extend_from_slice(&IPC_END_OF_STREAM);
    Ok(buf)
}

/// The end-of-stream marker: continuation marker, zero-length message.
const IPC_END_OF_STREAM: [u8; 8] = [0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0];

/// The one batch of Arrow IPC stream bytes written by [`encode_ipc`].
pub fn decode_ipc(bytes: &[u8]) -> Result<RecordBatch> {
    let mut reader = arrow::ipc::reader::StreamReader::try_new(bytes, None)?;
    match reader.next() {
        Some(b) => Ok(b?),
        None => Err(Error::internal("append without a record batch")),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use arrow::array::{Float64Array, Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};

    fn batch() -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("customer", DataType::Int64, false),
            Field::new("amount", DataType::Float64, true),
            Field::new("payload", DataType::Utf8, true),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(vec![1, 2, 3])),
                Arc::new(Float64Array::from(vec![Some(1.5), None, Some(-0.25)])),
                Arc::new(StringArray::from(vec![Some("a"), Some(""), None])),
            ],
        )
        .unwrap()
    }

    #[test]
    fn the_cached_schema_encoding_writes_what_a_stream_writer_writes() {
        let b = batch();
        let mut expected = Vec::new();
        {
            let mut w =
                arrow::ipc::writer::StreamWriter::try_new(&mut expected, &b.schema()).unwrap();
            w.write(&b).unwrap();
            w.finish().unwrap();
        }
        let header = ipc_schema_message(&b.schema()).unwrap();
        assert_eq!(encode_ipc_with(&header, &b).unwrap(), expected);
        assert_eq!(encode_ipc(&b).unwrap(), expected);
        assert_eq!(decode_ipc(&expected).unwrap(), b);
    }
}

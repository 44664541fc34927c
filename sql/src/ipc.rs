//! The Arrow IPC codec: the bytes rows take in a replicated append and in a
//! segment frame. One batch is one IPC stream — schema message, the batch's
//! dictionaries and record batch, the end-of-stream marker — byte for byte
//! what arrow's `StreamWriter` writes, so any IPC reader reads it. A stream
//! caches its schema message ([`Stream::ipc_schema`](crate::catalog::Stream::ipc_schema)),
//! so the hot path encodes only the batch.
//!
//! A stream's appends may use Arrow's own buffer compression (LZ4 frame or ZSTD, per
//! buffer, recorded in the record batch message, so every IPC reader decodes it): a batch
//! whose Arrow buffers hold at least [`COMPRESS_MIN_BYTES`] is compressed; a smaller one is
//! not (each compressed buffer carries an 8-byte length, which a one-row batch does not
//! earn back). Arrow keeps a buffer uncompressed where compression does not shrink it.

use std::cell::RefCell;

use arrow::array::RecordBatch;
use arrow::ipc::writer::{
    write_message, DictionaryTracker, IpcDataGenerator, IpcWriteContext, IpcWriteOptions,
};
use arrow::ipc::CompressionType;

use crate::error::{Error, Result};

/// Arrow IPC stream bytes of one batch: the form rows take in a command and
/// in a segment.
pub fn encode_ipc(batch: &RecordBatch) -> Result<Vec<u8>> {
    encode_ipc_with(&ipc_schema_message(&batch.schema())?, batch, None)
}

thread_local! {
    /// Arrow's encoding context, kept by each thread that encodes batches uncompressed or
    /// with LZ4: its flatbuffer builder keeps its capacity across batches (a fresh one grows
    /// from nothing for every batch: growing it was a sixth of a one-row INSERT's encoding
    /// in a profile). It holds one message header's worth of bytes.
    static WRITE_CONTEXT: RefCell<IpcWriteContext> = RefCell::new(IpcWriteContext::default());
}

/// Batches with fewer bytes of Arrow buffers than this are never compressed.
pub const COMPRESS_MIN_BYTES: usize = 1024;

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
/// marker — exactly what a `StreamWriter` writes; with `compression`, its
/// buffers compressed if the batch is large enough (see the module's notes).
pub fn encode_ipc_with(
    schema_message: &[u8],
    batch: &RecordBatch,
    compression: Option<CompressionType>,
) -> Result<Vec<u8>> {
    Ok(encode_batch(schema_message, batch, compression)?.ipc)
}

/// A batch encoded by [`encode_batch`], with the sizes its append needs.
#[derive(Debug)]
pub struct Encoded {
    /// The IPC stream bytes, as [`encode_ipc_with`] makes them.
    pub ipc: Vec<u8>,
    /// `ipc`'s [`logical_len`](sluice_storage::frame::logical_len): its length with every
    /// compressed buffer counted uncompressed — known here without parsing the bytes again.
    pub logical_len: u64,
    /// The batch's [`batch_data_len`], when a compression was asked for (it decides whether
    /// to compress); `None` otherwise.
    pub data_len: Option<usize>,
}

/// [`encode_ipc_with`], with the sizes an append carries (see [`Encoded`]).
pub fn encode_batch(
    schema_message: &[u8],
    batch: &RecordBatch,
    compression: Option<CompressionType>,
) -> Result<Encoded> {
    let data_len = compression.map(|_| batch_data_len(batch));
    let compress = match (compression, data_len) {
        (Some(c), Some(len)) if len >= COMPRESS_MIN_BYTES => Some(c),
        _ => None,
    };
    let options = IpcWriteOptions::default().try_with_compression(compress)?;
    let encode = |context: &mut IpcWriteContext| {
        let mut tracker = DictionaryTracker::new(false);
        IpcDataGenerator::default().encode(batch, &mut tracker, &options, context)
    };
    // a zstd compressor's state is not kept past the batch (as before)
    let (dictionaries, encoded) = match compress {
        Some(CompressionType::ZSTD) => encode(&mut IpcWriteContext::default()),
        _ => WRITE_CONTEXT.with(|c| match c.try_borrow_mut() {
            Ok(mut context) => {
                let encoded = encode(&mut context);
                if encoded.is_err() {
                    // a failed encoding may leave a half-built header behind
                    *context = IpcWriteContext::default();
                }
                encoded
            }
            Err(_) => encode(&mut IpcWriteContext::default()),
        }),
    }?;
    let mut buf = Vec::with_capacity(schema_message.len() + batch.get_array_memory_size() + 256);
    buf.extend_from_slice(schema_message);
    for d in dictionaries {
        write_message(&mut buf, d, &options)?;
    }
    write_message(&mut buf, encoded, &options)?;
    buf.extend_from_slice(&IPC_END_OF_STREAM);
    // uncompressed bytes are their own logical length; compressed ones are measured
    let logical_len = match compress {
        Some(_) => sluice_storage::frame::logical_len(&buf),
        None => buf.len() as u64,
    };
    Ok(Encoded {
        ipc: buf,
        logical_len,
        data_len,
    })
}

/// Bytes of `batch`'s Arrow buffers (their lengths, not their allocations): about its
/// uncompressed IPC size, and what a reader holds once it decodes it.
pub fn batch_data_len(batch: &RecordBatch) -> usize {
    batch.columns().iter().map(|c| data_len(&c.to_data())).sum()
}

/// Bytes of `data`'s buffers (their lengths, not their allocations), children included.
fn data_len(data: &arrow::array::ArrayData) -> usize {
    data.buffers().iter().map(|b| b.len()).sum::<usize>()
        + data.nulls().map_or(0, |n| n.buffer().len())
        + data.child_data().iter().map(data_len).sum::<usize>()
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
        assert_eq!(encode_ipc_with(&header, &b, None).unwrap(), expected);
        // too small to compress
        assert_eq!(
            encode_ipc_with(&header, &b, Some(CompressionType::ZSTD)).unwrap(),
            expected
        );
        assert_eq!(encode_ipc(&b).unwrap(), expected);
        assert_eq!(decode_ipc(&expected).unwrap(), b);
    }

    /// The thread's reused encoding context leaves nothing behind: batches of different
    /// shapes, compressed or not, encoded one after another on one thread are each what a
    /// fresh `StreamWriter` writes.
    #[test]
    fn encodings_in_a_row_on_one_thread_are_each_a_stream_writers() {
        let wide = batch();
        let schema = Arc::new(Schema::new(vec![Field::new("p", DataType::Utf8, false)]));
        let payload = StringArray::from(vec!["x".repeat(2_000)]);
        let narrow = RecordBatch::try_new(schema, vec![Arc::new(payload)]).unwrap();
        for b in [&wide, &narrow, &wide, &narrow, &wide] {
            for c in [None, Some(CompressionType::LZ4_FRAME)] {
                let compress = c.filter(|_| batch_data_len(b) >= COMPRESS_MIN_BYTES);
                let options = IpcWriteOptions::default()
                    .try_with_compression(compress)
                    .unwrap();
                let mut expected = Vec::new();
                {
                    let mut w = arrow::ipc::writer::StreamWriter::try_new_with_options(
                        &mut expected,
                        &b.schema(),
                        options,
                    )
                    .unwrap();
                    w.write(b).unwrap();
                    w.finish().unwrap();
                }
                let header = ipc_schema_message(&b.schema()).unwrap();
                assert_eq!(encode_ipc_with(&header, b, c).unwrap(), expected, "{c:?}");
            }
        }
    }

    #[test]
    fn large_batches_are_compressed_and_read_back_by_any_reader() {
        let schema = Arc::new(Schema::new(vec![Field::new("p", DataType::Utf8, false)]));
        let rows: Vec<String> = (0..200)
            .map(|i| format!("event {i} {}", "x".repeat(100)))
            .collect();
        let b =
            RecordBatch::try_new(schema.clone(), vec![Arc::new(StringArray::from(rows))]).unwrap();
        let header = ipc_schema_message(&schema).unwrap();
        let plain = encode_ipc_with(&header, &b, None).unwrap();
        for c in [CompressionType::LZ4_FRAME, CompressionType::ZSTD] {
            let packed = encode_ipc_with(&header, &b, Some(c)).unwrap();
            assert!(
                packed.len() * 4 < plain.len(),
                "{c:?}: {} vs {}",
                packed.len(),
                plain.len()
            );
            assert_eq!(decode_ipc(&packed).unwrap(), b);
            // the stored payload's uncompressed size is known without decompressing, and
            // the encoder's figure is the one storage would compute
            let logical = sluice_storage::frame::logical_len(&packed);
            let encoded = encode_batch(&header, &b, Some(c)).unwrap();
            assert_eq!((encoded.ipc, encoded.logical_len), (packed, logical));
            assert!(
                logical.abs_diff(plain.len() as u64) <= 64,
                "{c:?}: logical {logical} vs plain {}",
                plain.len()
            );
        }
        assert_eq!(
            sluice_storage::frame::logical_len(&plain),
            plain.len() as u64
        );
    }
}

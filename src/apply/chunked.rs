//! A blob larger than one Secret holds (1 MiB) stored in the agent's namespace as chunk Secrets
//! `<name>-1` … `<name>-<n>` of at most [`CHUNK_BYTES`] each. The index Secret `<name>` that
//! records `n` (and whatever authenticates the blob) is the caller's, written after
//! [`write_chunks`] so an interrupted write is never listed. Snapshots and the agent's
//! last-known-good store keep their bytes this way.

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, PostParams};
use std::collections::BTreeMap;

/// Largest chunk in one Secret (Secrets are limited to 1 MiB).
pub const CHUNK_BYTES: usize = 512 * 1024;

/// What [`write_chunks`] does with a chunk Secret that already exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Existing {
    /// Refuse it: the name may hold other bytes.
    Fail,
    /// Keep it: the name is content-addressed, so it holds these bytes.
    Keep,
}

/// Writes `bytes` as the chunk Secrets of `name` (data key `key`, labelled `labels`); returns how
/// many there are.
pub(crate) async fn write_chunks(
    api: &Api<Secret>,
    name: &str,
    key: &str,
    bytes: &[u8],
    labels: &BTreeMap<String, String>,
    existing: Existing,
) -> Result<usize, kube::Error> {
    let chunks: Vec<&[u8]> = bytes.chunks(CHUNK_BYTES).collect();
    for (i, chunk) in chunks.iter().enumerate() {
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(format!("{name}-{}", i + 1)),
                labels: Some(labels.clone()),
                ..Default::default()
            },
            data: Some(BTreeMap::from([(key.to_string(), ByteString(chunk.to_vec()))])),
            ..Default::default()
        };
        match api.create(&PostParams::default(), &secret).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 && existing == Existing::Keep => {}
            Err(e) => return Err(e),
        }
    }
    Ok(chunks.len())
}

/// Why [`read_chunks`] could not put a blob back together.
#[derive(Debug)]
pub(crate) enum ChunkError {
    /// Chunk Secret `name` does not exist or holds no data under the key.
    Missing(String),
    /// Reading chunk Secret `name` failed.
    Api { name: String, source: kube::Error },
}

/// The bytes of chunks `<name>-1` … `<name>-<count>` (data key `key`), in order.
pub(crate) async fn read_chunks(api: &Api<Secret>, name: &str, key: &str, count: usize) -> Result<Vec<u8>, ChunkError> {
    let mut bytes = Vec::new();
    for i in 1..=count {
        let chunk_name = format!("{name}-{i}");
        let secret =
            api.get_opt(&chunk_name).await.map_err(|source| ChunkError::Api { name: chunk_name.clone(), source })?;
        let data = secret.and_then(|s| s.data).and_then(|mut d| d.remove(key));
        bytes.extend_from_slice(&data.ok_or(ChunkError::Missing(chunk_name))?.0);
    }
    Ok(bytes)
}

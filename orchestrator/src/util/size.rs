//! Byte sizes as people write them: `512MiB`, `2GiB`, `1.5GB`, `64G`, `1000000`.
//! Hand-written: `bytesize` reads `64G` as 10^9 bytes, SLURM (and this file) as 2^30.

use serde::{Deserialize, Deserializer};

/// A size that is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    #[error("invalid size {0:?}, expected e.g. 512MiB, 2GiB or a number of bytes")]
    Syntax(String),
    #[error("invalid size {0:?}: must be at least one byte and below 16 EiB")]
    OutOfRange(String),
}

/// Bytes of `s`. Binary units (`KiB`…`TiB`, and SLURM-style `K`/`M`/`G`/`T`)
/// are powers of 1024, `kB`/`MB`/`GB`/`TB` powers of 1000; case is ignored.
pub fn parse(s: &str) -> Result<u64, SizeError> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = (&t[..split], t[split..].trim());
    let bad = || SizeError::Syntax(s.to_string());
    let n: f64 = num.parse().map_err(|_| bad())?;
    let mult: f64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024f64.powi(2),
        "g" | "gib" => 1024f64.powi(3),
        "t" | "tib" => 1024f64.powi(4),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        _ => return Err(bad()),
    };
    let bytes = (n * mult).round();
    if !(bytes >= 1.0 && bytes < u64::MAX as f64) {
        return Err(SizeError::OutOfRange(s.to_string()));
    }
    Ok(bytes as u64)
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Raw {
    Bytes(u64),
    Text(String),
}

pub fn optional<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    match Option::<Raw>::deserialize(d)
        .map_err(|_| serde::de::Error::custom("expected a size like 512MiB, 2GiB or a number of bytes"))?
    {
        None => Ok(None),
        Some(Raw::Bytes(0)) => Err(serde::de::Error::custom("a memory limit of 0 bytes refuses every allocation")),
        Some(Raw::Bytes(n)) => Ok(Some(n)),
        Some(Raw::Text(s)) => parse(&s).map(Some).map_err(serde::de::Error::custom),
    }
}

//! Reading JSON Lines that another process may still be appending to, with
//! one rule for the last line: text after the last newline is a line if it
//! parses whole (its newline not written yet), and otherwise a torn write,
//! which is no line at all (it is read again, whole, next time).

use serde::de::DeserializeOwned;

/// One line of a JSONL text.
#[derive(Debug)]
pub struct Line<T> {
    /// 1-based line number.
    pub number: usize,
    /// Byte offset just past the line (past its newline, when it has one).
    pub end: usize,
    pub value: Result<T, serde_json::Error>,
}

/// A JSONL text read by the one rule.
#[derive(Debug)]
pub struct Lines<T> {
    /// The newline-terminated lines, blank ones left out.
    pub complete: Vec<Line<T>>,
    /// Bytes through the last newline: where a reader that goes on later
    /// (reading only what is new) starts again.
    pub consumed: usize,
    /// The text after the last newline, when it parses whole.
    pub last: Option<Line<T>>,
    /// The text after the last newline did not parse: a torn write.
    pub torn: bool,
}

impl<T> Lines<T> {
    /// Every line, the unterminated last one included when whole.
    pub fn all(self) -> impl Iterator<Item = Line<T>> {
        self.complete.into_iter().chain(self.last)
    }
}

/// Reads `bytes` as JSON Lines of `T`.
pub fn read<T: DeserializeOwned>(bytes: &[u8]) -> Lines<T> {
    let consumed = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    let mut complete = Vec::new();
    let mut start = 0;
    for (number, chunk) in bytes[..consumed].split_inclusive(|&b| b == b'\n').enumerate() {
        let end = start + chunk.len();
        let line = chunk.trim_ascii();
        start = end;
        if !line.is_empty() {
            complete.push(Line { number: number + 1, end, value: serde_json::from_slice(line) });
        }
    }
    let tail = bytes[consumed..].trim_ascii();
    let number = bytes[..consumed].iter().filter(|&&b| b == b'\n').count() + 1;
    let (last, torn) = match serde_json::from_slice(tail) {
        _ if tail.is_empty() => (None, false),
        Ok(v) => (Some(Line { number, end: bytes.len(), value: Ok(v) }), false),
        Err(_) => (None, true),
    };
    Lines { complete, consumed, last, torn }
}

/// Every value of a JSONL text by the one rule, or the first line that does
/// not parse (its number and error).
pub fn values<T: DeserializeOwned>(text: &str) -> Result<Vec<T>, (usize, serde_json::Error)> {
    read(text.as_bytes()).all().map(|l| l.value.map_err(|e| (l.number, e))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    type V = serde_json::Value;

    #[test]
    fn complete_lines_carry_their_numbers_and_ends() {
        let r = read::<V>(b"{\"a\":1}\n\n{\"a\":2}\n");
        let got: Vec<(usize, usize)> = r.complete.iter().map(|l| (l.number, l.end)).collect();
        assert_eq!(got, [(1, 8), (3, 17)]);
        assert_eq!(r.consumed, 17);
        assert!(r.last.is_none() && !r.torn);
    }

    #[test]
    fn an_unterminated_last_line_counts_when_whole_and_is_torn_otherwise() {
        let whole = read::<V>(b"{\"a\":1}\n{\"a\":2}");
        assert_eq!(whole.consumed, 8);
        assert_eq!(whole.last.as_ref().map(|l| l.number), Some(2));
        assert!(!whole.torn);
        assert_eq!(values::<V>("{\"a\":1}\n{\"a\":2}").map(|v| v.len()).ok(), Some(2));
        let torn = read::<V>(b"{\"a\":1}\n{\"a\":");
        assert!(torn.last.is_none() && torn.torn);
        assert_eq!(values::<V>("{\"a\":1}\n{\"a\":").map(|v| v.len()).ok(), Some(1));
    }

    #[test]
    fn a_bad_complete_line_is_an_error_naming_it() {
        let e = values::<V>("{\"a\":1}\nnope\n{\"a\":2}\n").unwrap_err();
        assert_eq!(e.0, 2);
    }
}

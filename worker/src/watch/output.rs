//! The watched command's stdout and stderr: passed through to the job's log as
//! they come, and read line by line on the way for the command's own word
//! that it ran out of memory, and for the last lines a failure's message quotes.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::sync::{Arc, Mutex};

/// Lines that say the command ran out of GPU memory: PyTorch's
/// `torch.OutOfMemoryError: CUDA out of memory. Tried to allocate …`, the
/// CUDA runtime's `CUDA error: out of memory`, cuBLAS's allocation failure.
const OOM_MARKS: [&str; 5] = [
    "CUDA out of memory",
    "OutOfMemoryError",
    "CUDA error: out of memory",
    "cudaErrorMemoryAllocation",
    "CUBLAS_STATUS_ALLOC_FAILED",
];

/// Whether a line of the command's output says it ran out of memory.
pub fn says_oom(line: &str) -> bool {
    OOM_MARKS.iter().any(|m| line.contains(m))
}

/// A line longer than this is cut (a progress bar redrawn without a newline
/// must not grow without bound); what follows is still passed through.
const MAX_LINE: usize = 4096;
/// Lines kept for a failure's message.
const TAIL_LINES: usize = 5;

/// What the output said, shared by the two pumps.
#[derive(Debug, Default)]
pub struct Seen {
    /// The first line that said out of memory.
    pub oom_line: Option<String>,
    /// The last non-empty lines, oldest first.
    pub tail: VecDeque<String>,
    /// What the progress expression matched last (`Epoch 12/500`).
    pub progress: Option<String>,
    progress_re: Option<regex_lite::Regex>,
}

impl Seen {
    /// A `Seen` that also keeps the last match of `progress` in the output.
    pub fn with_progress(progress: Option<regex_lite::Regex>) -> Seen {
        Seen { progress_re: progress, ..Seen::default() }
    }

    fn line(&mut self, bytes: &[u8]) {
        let line = String::from_utf8_lossy(bytes).trim().to_string();
        if line.is_empty() {
            return;
        }
        if let Some(m) = self.progress_re.as_ref().and_then(|re| re.find(&line)) {
            self.progress = Some(m.as_str().to_string());
        }
        if self.oom_line.is_none() && says_oom(&line) {
            self.oom_line = Some(line.clone());
        }
        if self.tail.len() == TAIL_LINES {
            self.tail.pop_front();
        }
        self.tail.push_back(line);
    }

    /// The last line the command printed.
    pub fn last_line(&self) -> Option<&str> {
        self.tail.back().map(String::as_str)
    }
}

/// Copy `from` to `to` until its end, each chunk as it comes, and feed its
/// lines (ended by `\n` or `\r`) to `seen`.
pub fn pump(mut from: impl Read, mut to: impl Write, seen: Arc<Mutex<Seen>>) {
    let mut buf = [0u8; 8192];
    let mut line: Vec<u8> = Vec::new();
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        // The log may be gone (a closed terminal): the command still runs.
        let _ = to.write_all(&buf[..n]).and_then(|()| to.flush());
        let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
        for &b in &buf[..n] {
            if b == b'\n' || b == b'\r' {
                seen.line(&line);
                line.clear();
            } else if line.len() < MAX_LINE {
                line.push(b);
            }
        }
    }
    seen.lock().unwrap_or_else(|p| p.into_inner()).line(&line);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pytorchs_and_cudas_out_of_memory_lines_are_recognised() {
        assert!(says_oom("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"));
        assert!(says_oom("RuntimeError: CUDA error: out of memory"));
        assert!(!says_oom("epoch 3: loss 0.12, memory 41.2 GiB"));
    }

    #[test]
    fn output_passes_through_and_its_lines_are_seen() {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let text = b"step 1\rstep 2\nRuntimeError: CUDA error: out of memory\nl1\nl2\nl3\nl4\nlast";
        let mut out = Vec::new();
        pump(&text[..], &mut out, seen.clone());
        assert_eq!(out, text.to_vec());
        let seen = seen.lock().unwrap();
        assert_eq!(seen.oom_line.as_deref(), Some("RuntimeError: CUDA error: out of memory"));
        assert_eq!(seen.tail.iter().map(String::as_str).collect::<Vec<_>>(), ["l1", "l2", "l3", "l4", "last"]);
        assert_eq!(seen.last_line(), Some("last"));
    }
}

//! A phase's error or panic as a result's status and message.

use facts::event::RunStatus;

/// Memory text of an error that means the device ran out of memory: the host
/// allocator's, and CubeCL's (`IoError::OutOfMemory` "out of device memory
/// allocating N bytes", `LaunchError::OutOfMemory` "An out-of-memory error
/// happened during launch", `IoError::BufferTooBig` "can't allocate buffer of
/// size": one tensor larger than the device can ever hold).
pub(super) fn is_oom_message(msg: &str) -> bool {
    let m = msg.to_ascii_lowercase();
    [
        "out of memory",
        "outofmemory",
        "out-of-memory",
        "out of device memory",
        "can't allocate buffer of size",
        "memory allocation of",
        "allocation failed",
    ]
    .iter()
    .any(|needle| m.contains(needle))
}

/// An error or panic text fit for an event: its first line and, for a chain
/// of causes (CubeCL's execution errors), the root cause and the kernels that
/// were skipped for it; the captured backtraces belong in the job's log, not
/// the result.
pub(super) fn short_message(msg: &str) -> String {
    let lines: Vec<&str> = msg
        .lines()
        .map(str::trim)
        .take_while(|l| !l.starts_with("Backtrace") && !l.starts_with("Asked at:"))
        .filter(|l| !l.is_empty() && *l != "No backtrace available")
        .collect();
    let text = match lines.iter().rposition(|l| *l == "Caused by:") {
        Some(i) => {
            let mut skipped: Vec<&str> = Vec::new();
            for l in &lines {
                if let Some(kernel) = l.strip_prefix("skipped `").and_then(|r| r.split('`').next()) {
                    if !skipped.contains(&kernel) {
                        skipped.push(kernel);
                    }
                }
            }
            let skipped = if skipped.is_empty() {
                String::new()
            } else {
                format!(" (kernels skipped for it: {})", skipped.join(", "))
            };
            format!("{}: {}{skipped}", lines[0], lines[i + 1..].join(" "))
        }
        None => lines.iter().take(4).copied().collect::<Vec<_>>().join(" "),
    };
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match text.char_indices().nth(400) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text,
    }
}

/// A phase's error or panic as a result: `oom` when it is a memory failure.
pub(super) fn classify(msg: &str) -> (RunStatus, String) {
    let status = if is_oom_message(msg) { RunStatus::Oom } else { RunStatus::Failed };
    (status, short_message(msg))
}

pub(super) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic with a non-text payload".into()
    }
}

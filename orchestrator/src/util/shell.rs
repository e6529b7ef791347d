//! Quoting words for a POSIX shell. Hand-written: `shlex::try_quote` picks
//! double quotes for some words (`"it's"`), while the scripts and the remote
//! commands are specified, and tested, with single quotes only.

/// `x` as one POSIX shell word: bare when it is made of inert characters, else
/// single-quoted with embedded `'` written as `'\''`.
pub fn sh_quote(s: &str) -> String {
    let inert = |c: char| c.is_ascii_alphanumeric() || "_./:=,@%+-".contains(c);
    if !s.is_empty() && s.chars().all(inert) {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_makes_one_inert_word() {
        assert_eq!(sh_quote("plain-1.0"), "plain-1.0");
        assert_eq!(sh_quote(""), "''");
        assert_eq!(sh_quote("$(touch /tmp/x)"), "'$(touch /tmp/x)'");
        assert_eq!(sh_quote("it's"), r"'it'\''s'");
        assert_eq!(sh_quote("a\nb"), "'a\nb'");
    }
}

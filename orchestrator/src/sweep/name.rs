//! Config names: the `sweep.name` template, or the labels of the axis values
//! that made the config. A name must stay true: a label whose values a
//! command-line override replaced no longer describes the config, so it gives
//! way to labels of what the choice still sets.

use serde_yaml::Value;

use crate::experiment::locate::KeyPath;
use crate::experiment::{overrides_get, show};

/// A parsed `sweep.name` template: literal text and `{dotted.key}` holes.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Template {
    parts: Vec<Part>,
}

#[derive(Debug, Clone, PartialEq)]
enum Part {
    Text(String),
    Key(String),
}

impl Template {
    /// Parse `"{model.variant}_p{model.patch}"`; the error says what is wrong with it.
    pub fn parse(t: &str) -> Result<Self, String> {
        let mut parts = Vec::new();
        let mut rest = t;
        while let Some(start) = rest.find(['{', '}']) {
            if rest[start..].starts_with('}') {
                return Err(format!("`}}` without `{{` in the name template {t:?}"));
            }
            if start > 0 {
                parts.push(Part::Text(rest[..start].to_string()));
            }
            let Some(len) = rest[start..].find('}') else {
                return Err(format!("`{{` without `}}` in the name template {t:?}"));
            };
            let key = rest[start + 1..start + len].trim();
            if key.is_empty() || key.contains('{') || key.split('.').any(str::is_empty) {
                return Err(format!(
                    "`{{{key}}}` in the name template {t:?} is not a dotted key such as {{model.patch}}"
                ));
            }
            parts.push(Part::Key(key.to_string()));
            rest = &rest[start + len + 1..];
        }
        if !rest.is_empty() {
            parts.push(Part::Text(rest.to_string()));
        }
        Ok(Template { parts })
    }

    /// The template filled from one config's document, or the first key it does not set.
    pub fn fill(&self, doc: &Value) -> Result<String, String> {
        let mut out = String::new();
        for p in &self.parts {
            match p {
                Part::Text(s) => out.push_str(s),
                Part::Key(k) => match overrides_get(doc, &KeyPath::from_dotted(k)) {
                    Some(v) if !v.is_null() => out.push_str(&render(k, v)),
                    _ => return Err(k.clone()),
                },
            }
        }
        Ok(sanitize(&out))
    }
}

/// `patch2`, `S`, `32-64-128`, `no-grad_ckpt`: short, readable, filesystem-safe.
pub(crate) fn auto_label(key: &str, v: &Value) -> String {
    let last = key.rsplit('.').next().unwrap_or(key);
    match v {
        Value::Number(n) => format!("{last}{n}"),
        Value::Bool(true) => last.to_string(),
        Value::Bool(false) => format!("no-{last}"),
        _ => render(key, v),
    }
}

/// A value with its key, where a bare value would not say what it is:
/// `num_head_channels-0-0-32-32` (a label replaced after an override).
pub(crate) fn describe(key: &str, v: &Value) -> String {
    let last = key.rsplit('.').next().unwrap_or(key);
    match v {
        Value::Sequence(_) | Value::Mapping(_) if !key.ends_with("spatial") => format!("{last}-{}", render(key, v)),
        Value::String(s) => format!("{last}-{s}"),
        _ => auto_label(key, v),
    }
}

/// A value as it appears in names: lists joined by `-`, spatial shapes as HxWxD.
pub(crate) fn render(key: &str, v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Sequence(items) if key.ends_with("spatial") && items.len() == 3 => {
            format!("{}x{}x{}", show(&items[1]), show(&items[2]), show(&items[0]))
        }
        Value::Sequence(items) => items.iter().map(|x| render("", x)).collect::<Vec<_>>().join("-"),
        Value::Mapping(m) if key.ends_with("spatial") => {
            let g = |k: &str| m.get(k).map(show).unwrap_or_default();
            format!("{}x{}x{}", g("h"), g("w"), g("d"))
        }
        other => show(other),
    }
}

/// Names become folder names in the state directory.
pub(crate) fn sanitize(s: &str) -> String {
    s.chars().map(sanitize_char).collect()
}

/// One character of [`sanitize`]: kept, or `_`.
pub(crate) fn sanitize_char(c: char) -> char {
    if c.is_ascii_alphanumeric() || "._-".contains(c) {
        c
    } else {
        '_'
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_parse_and_fill() {
        let t = Template::parse("{model.variant}_p{model.patch}").unwrap();
        let doc: Value = serde_yaml::from_str("model: {variant: S, patch: 2}").unwrap();
        assert_eq!(t.fill(&doc), Ok("S_p2".into()));
        let unet: Value = serde_yaml::from_str("model: {family: unet, patch: 2}").unwrap();
        assert_eq!(t.fill(&unet), Err("model.variant".into()));
        for bad in ["{model.variant", "p}x", "{}", "{model.}", "{a{b}}"] {
            assert!(Template::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(Template::parse("plain").unwrap().fill(&doc), Ok("plain".into()));
    }

    #[test]
    fn describe_says_which_key_a_list_is() {
        let v: Value = serde_yaml::from_str("[0, 0, 32, 32]").unwrap();
        assert_eq!(describe("model.num_head_channels", &v), "num_head_channels-0-0-32-32");
        assert_eq!(describe("model.num_res_blocks", &Value::from(3)), "num_res_blocks3");
        let sp: Value = serde_yaml::from_str("[20, 32, 32]").unwrap();
        assert_eq!(describe("input.spatial", &sp), "32x32x20");
    }
}

//! Hydra-style `key.path=value` overrides, as the group types them today:
//! `model.num_res_blocks=3 'model.channels=[64, 128, 256, 512]'`.

use serde_yaml::{Mapping, Value};

use super::locate::{KeyPath, Seg};
use super::LoadError;

/// One `dotted.key=yaml-value` from the command line.
#[derive(Debug, Clone, PartialEq)]
pub struct Override {
    pub key: KeyPath,
    pub value: Value,
    /// The argument as typed, for error messages.
    pub arg: String,
}

impl std::str::FromStr for Override {
    type Err = LoadError;
    fn from_str(arg: &str) -> Result<Self, LoadError> {
        let err = |message: String| LoadError::Override { arg: arg.to_string(), message };
        let (key, value) = arg.split_once('=').ok_or_else(|| err("expected key.path=value".into()))?;
        let key = key.trim().trim_start_matches('+');
        if key.is_empty() || key.split('.').any(str::is_empty) {
            return Err(err("empty key".into()));
        }
        let value: Value = serde_yaml::from_str(value).map_err(|e| err(format!("value is not YAML: {e}")))?;
        Ok(Override { key: KeyPath::from_dotted(key), value, arg: arg.to_string() })
    }
}

/// Set `value` at `key` inside `doc`, creating mappings on the way.
/// Fails only when a step crosses something that is not a mapping.
pub(crate) fn set(doc: &mut Value, key: &KeyPath, value: Value) -> Result<(), String> {
    let mut cur = doc;
    for (i, seg) in key.0.iter().enumerate() {
        let Seg::Key(k) = seg else { return Err("list indices cannot be overridden".into()) };
        if cur.is_null() {
            *cur = Value::Mapping(Mapping::new());
        }
        let Value::Mapping(map) = cur else {
            let upto = KeyPath(key.0[..i].to_vec());
            return Err(format!("`{upto}` is not a mapping, cannot set `{key}`"));
        };
        let k = Value::String(k.clone());
        if i + 1 == key.0.len() {
            map.insert(k, value);
            return Ok(());
        }
        cur = map.entry(k).or_insert(Value::Null);
    }
    Ok(())
}

/// The value at `key` inside `doc`, if any.
pub(crate) fn get<'a>(doc: &'a Value, key: &KeyPath) -> Option<&'a Value> {
    key.0.iter().try_fold(doc, |cur, seg| match seg {
        Seg::Key(k) => cur.as_mapping()?.get(k.as_str()),
        Seg::Index(i) => cur.as_sequence()?.get(*i),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lists_and_scalars() {
        let o: Override = "model.channels=[64, 128, 256, 512]".parse().unwrap();
        assert_eq!(o.key.to_string(), "model.channels");
        assert_eq!(o.value, serde_yaml::from_str::<Value>("[64, 128, 256, 512]").unwrap());
        let o: Override = "model.num_res_blocks=3".parse().unwrap();
        assert_eq!(o.value, Value::from(3));
    }

    #[test]
    fn rejects_missing_equals() {
        let e = "model.channels".parse::<Override>().unwrap_err();
        assert!(e.to_string().contains("expected key.path=value"), "{e}");
    }

    #[test]
    fn sets_nested_keys() {
        let mut doc: Value = serde_yaml::from_str("model: {family: unet}").unwrap();
        set(&mut doc, &KeyPath::from_dotted("model.channels"), Value::from(vec![1, 2])).unwrap();
        assert_eq!(get(&doc, &KeyPath::from_dotted("model.channels")), Some(&Value::from(vec![1, 2])));
        assert!(set(&mut doc, &KeyPath::from_dotted("model.family.x"), Value::Null).is_err());
    }
}

//! Where each value of a YAML file sits (line and column), by key path, so an
//! error found after the file became a `serde_yaml::Value` still names its place.

use std::collections::HashMap;
use std::fmt;
use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::Marker;

/// One step of a key path: a mapping key or a list index.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Seg {
    Key(String),
    Index(usize),
}

/// A key path such as `sweep.grid."model.channels"[2]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct KeyPath(pub Vec<Seg>);

impl KeyPath {
    pub fn key(mut self, k: impl Into<String>) -> Self {
        self.0.push(Seg::Key(k.into()));
        self
    }
    pub fn index(mut self, i: usize) -> Self {
        self.0.push(Seg::Index(i));
        self
    }
    /// The path after a `serde_path_to_error` path.
    pub fn join_serde(mut self, p: &serde_path_to_error::Path) -> Self {
        use serde_path_to_error::Segment;
        for s in p.iter() {
            match s {
                Segment::Seq { index } => self.0.push(Seg::Index(*index)),
                Segment::Map { key } => self.0.push(Seg::Key(key.clone())),
                Segment::Enum { variant } => self.0.push(Seg::Key(variant.clone())),
                Segment::Unknown => {}
            }
        }
        self
    }
    /// Dotted override key (`model.channels`) as a path.
    pub fn from_dotted(key: &str) -> Self {
        KeyPath(key.split('.').map(|k| Seg::Key(k.to_string())).collect())
    }
    pub fn starts_with(&self, prefix: &KeyPath) -> bool {
        self.0.starts_with(&prefix.0)
    }
}

impl fmt::Display for KeyPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for s in &self.0 {
            match s {
                Seg::Key(k) => {
                    if !first {
                        f.write_str(".")?;
                    }
                    if k.contains('.') {
                        write!(f, "\"{k}\"")?;
                    } else {
                        f.write_str(k)?;
                    }
                }
                Seg::Index(i) => write!(f, "[{i}]")?,
            }
            first = false;
        }
        if first {
            f.write_str("(document)")?;
        }
        Ok(())
    }
}

/// Line and column, both 1-based, as editors show them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pos {
    pub line: usize,
    pub col: usize,
}

/// A key written twice in one mapping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Duplicate {
    pub path: KeyPath,
    pub first: Pos,
    pub repeat: Pos,
}

/// Positions of every key and value in one YAML document.
#[derive(Debug, Default)]
pub struct Locations {
    values: HashMap<KeyPath, Pos>,
    keys: HashMap<KeyPath, Pos>,
    duplicates: Vec<Duplicate>,
}

impl Locations {
    /// Index `text`; a file that does not parse yields an empty index (the
    /// YAML parser's own error, with its position, is reported instead).
    pub fn index(text: &str) -> Self {
        let mut b = Builder::default();
        let mut parser = Parser::new_from_str(text);
        if parser.load(&mut b, false).is_err() {
            return Self::default();
        }
        b.loc
    }

    /// Where `path` is, or the nearest enclosing value that has a position.
    /// Points at the key for mapping entries (where a typo would be).
    pub fn find(&self, path: &KeyPath) -> Option<Pos> {
        let mut p = path.clone();
        loop {
            if let Some(pos) = self.keys.get(&p).or_else(|| self.values.get(&p)) {
                return Some(*pos);
            }
            p.0.pop()?;
        }
    }

    /// Keys repeated within one mapping, in file order.
    pub fn duplicates(&self) -> &[Duplicate] {
        &self.duplicates
    }

    /// Where the value (not the key) of `path` is.
    pub fn value(&self, path: &KeyPath) -> Option<Pos> {
        self.values.get(path).copied().or_else(|| self.find(path))
    }
}

enum Frame {
    Map { key: Option<String> },
    Seq { next: usize },
}

#[derive(Default)]
struct Builder {
    stack: Vec<Frame>,
    path: KeyPath,
    loc: Locations,
}

impl Builder {
    fn pos(mark: Marker) -> Pos {
        Pos { line: mark.line(), col: mark.col() + 1 }
    }
    /// A node starts at `mark`: record it at the path it fills. Returns false
    /// when the node is a mapping key (recorded as a key, not descended into).
    fn node(&mut self, scalar: Option<&str>, mark: Marker) -> bool {
        match self.stack.last_mut() {
            Some(Frame::Map { key }) if key.is_none() => {
                let k = scalar.unwrap_or_default().to_string();
                let p = self.path.clone().key(k.clone());
                // The document starts at its first key (a block mapping's start
                // event is marked after it).
                if self.path.0.is_empty() && self.loc.keys.is_empty() {
                    self.loc.values.insert(KeyPath::default(), Self::pos(mark));
                }
                match self.loc.keys.get(&p) {
                    Some(&first) => self.loc.duplicates.push(Duplicate { path: p, first, repeat: Self::pos(mark) }),
                    None => {
                        self.loc.keys.insert(p, Self::pos(mark));
                    }
                }
                *key = Some(k);
                false
            }
            Some(Frame::Map { key }) => {
                let k = key.clone().unwrap_or_default();
                self.path.0.push(Seg::Key(k));
                self.loc.values.entry(self.path.clone()).or_insert(Self::pos(mark));
                true
            }
            Some(Frame::Seq { next }) => {
                let i = *next;
                *next += 1;
                self.path.0.push(Seg::Index(i));
                self.loc.values.entry(self.path.clone()).or_insert(Self::pos(mark));
                true
            }
            None => {
                // The document itself: errors about it (a missing top-level
                // field) point at where it starts.
                self.loc.values.entry(KeyPath::default()).or_insert(Self::pos(mark));
                true
            }
        }
    }
    /// A value node ended: step back out of its path segment.
    fn done(&mut self) {
        if let Some(Frame::Map { key }) = self.stack.last_mut() {
            *key = None;
        }
        if !self.stack.is_empty() {
            self.path.0.pop();
        }
    }
}

impl MarkedEventReceiver for Builder {
    fn on_event(&mut self, ev: Event, mark: Marker) {
        match ev {
            Event::Scalar(s, ..) if self.node(Some(&s), mark) => self.done(),
            Event::Alias(_) if self.node(None, mark) => self.done(),
            Event::Scalar(..) | Event::Alias(_) => {}
            Event::MappingStart(..) => {
                self.node(None, mark);
                self.stack.push(Frame::Map { key: None });
            }
            Event::SequenceStart(..) => {
                self.node(None, mark);
                self.stack.push(Frame::Seq { next: 0 });
            }
            Event::MappingEnd | Event::SequenceEnd => {
                self.stack.pop();
                self.done();
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = "name: x\nmodel:\n  family: unet\n  channels: [32, 64]\nsweep:\n  grid:\n    model.channels:\n      - [1, 2]\n      - [3, 4]\n";

    #[test]
    fn finds_nested_keys_and_list_items() {
        let loc = Locations::index(DOC);
        let p = KeyPath::default().key("model").key("channels");
        assert_eq!(loc.find(&p), Some(Pos { line: 4, col: 3 }));
        assert_eq!(loc.value(&p.clone().index(1)), Some(Pos { line: 4, col: 18 }));
        let g = KeyPath::default().key("sweep").key("grid").key("model.channels").index(1);
        assert_eq!(loc.value(&g), Some(Pos { line: 9, col: 9 }));
    }

    #[test]
    fn unknown_paths_fall_back_to_the_parent() {
        let loc = Locations::index(DOC);
        let p = KeyPath::default().key("model").key("nope");
        assert_eq!(loc.find(&p), Some(Pos { line: 2, col: 1 }));
    }

    #[test]
    fn a_repeated_key_is_found_at_the_repeat() {
        let loc = Locations::index("name: a\nmodel:\n  family: unet\n  family: dit\nname: b\n");
        let d = loc.duplicates();
        assert_eq!(d.len(), 2);
        assert_eq!(d[0].path.to_string(), "model.family");
        assert_eq!((d[0].first, d[0].repeat), (Pos { line: 3, col: 3 }, Pos { line: 4, col: 3 }));
        assert_eq!((d[1].path.to_string(), d[1].repeat), ("name".into(), Pos { line: 5, col: 1 }));
        // The same key in two list items is no repeat.
        assert!(Locations::index("l:\n  - {a: 1}\n  - {a: 2}\n").duplicates().is_empty());
    }

    #[test]
    fn the_document_itself_has_a_position() {
        let loc = Locations::index("# comment\nname: x\n");
        assert_eq!(loc.find(&KeyPath::default()), Some(Pos { line: 2, col: 1 }));
    }

    #[test]
    fn displays_dotted_keys_quoted() {
        let p = KeyPath::default().key("sweep").key("grid").key("model.channels").index(2);
        assert_eq!(p.to_string(), "sweep.grid.\"model.channels\"[2]");
    }
}

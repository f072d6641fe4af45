//! The front matter of an agent file: a `---` line, YAML, a closing `---` (or `...`) line, then
//! the body. Only the shapes an agent field can take are kept — a scalar, a list of scalars, a
//! map of scalars — each with the file line its key is on, so that a bad value is reported at
//! its line. YAML anchors may be set but aliases are refused (an alias expands by copying, so a
//! small file could stand for a huge one), and nesting is capped.

use yaml_rust2::parser::{Event, Parser};
use yaml_rust2::scanner::{Marker, TScalarStyle};

/// How deep collections may nest (an agent field needs two levels; other tools' keys a few more).
const MAX_DEPTH: usize = 16;

/// A value of the front matter.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Node {
    /// A scalar; `plain` when unquoted (so `true` or `12` may be read as a boolean or a number).
    Scalar {
        text: String,
        plain: bool,
    },
    List(Vec<Node>),
    Map(Vec<(String, Node)>),
}

impl Node {
    /// The text of a scalar.
    pub(crate) fn as_text(&self) -> Option<&str> {
        match self {
            Node::Scalar { text, .. } => Some(text),
            Node::List(_) | Node::Map(_) => None,
        }
    }

    /// A plain `true`/`false` (YAML 1.2 core schema spellings).
    pub(crate) fn as_bool(&self) -> Option<bool> {
        match self {
            Node::Scalar { text, plain: true } => match text.as_str() {
                "true" | "True" | "TRUE" => Some(true),
                "false" | "False" | "FALSE" => Some(false),
                _ => None,
            },
            Node::Scalar { .. } | Node::List(_) | Node::Map(_) => None,
        }
    }

    /// A plain null (`~`, `null` or nothing).
    pub(crate) fn is_null(&self) -> bool {
        matches!(self, Node::Scalar { text, plain: true } if matches!(text.as_str(), "" | "~" | "null" | "Null" | "NULL"))
    }
}

/// One top-level key of the front matter, with the file line it is on (1-based).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Field {
    pub(crate) key: String,
    pub(crate) line: usize,
    pub(crate) value: Node,
}

/// A split agent file.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Front {
    pub(crate) fields: Vec<Field>,
    /// The text after the closing line, trimmed.
    pub(crate) body: String,
}

/// A problem with a file, at a line (1-based).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LineError {
    pub(crate) line: usize,
    pub(crate) message: String,
}

fn at(line: usize, message: impl Into<String>) -> LineError {
    LineError { line, message: message.into() }
}

/// Splits `text` into its front matter fields and body.
pub(crate) fn split(text: &str) -> Result<Front, LineError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut lines = text.split_inclusive('\n');
    let first = lines.next().unwrap_or_default();
    if first.trim_end() != "---" {
        return Err(at(
            1,
            "an agent file starts with a `---` line, then its front matter (name, description, …), then a closing `---` line",
        ));
    }
    let mut yaml = String::new();
    let mut offset = first.len();
    let mut closed = None;
    for line in lines {
        offset += line.len();
        if matches!(line.trim_end(), "---" | "...") {
            closed = Some(offset);
            break;
        }
        yaml.push_str(line);
    }
    let Some(body_start) = closed else {
        let last = text.lines().count().max(1);
        return Err(at(last, "the front matter has no closing `---` line"));
    };
    let fields = parse(&yaml)?;
    Ok(Front { fields, body: text[body_start..].trim().to_string() })
}

/// The file line of a marker in the YAML (which starts on the file's second line).
fn file_line(mark: &Marker) -> usize {
    mark.line() + 1
}

/// The top-level mapping of the front matter; empty front matter has no fields.
fn parse(yaml: &str) -> Result<Vec<Field>, LineError> {
    let mut parser = Parser::new_from_str(yaml);
    let mut next = move || parser.next_token().map_err(|e| at(file_line(e.marker()), e.info().to_string()));
    let mut fields: Option<Vec<Field>> = None;
    loop {
        let (event, mark) = next()?;
        let line = file_line(&mark);
        match event {
            Event::StreamStart | Event::DocumentStart | Event::DocumentEnd | Event::Nothing => {}
            Event::StreamEnd => return Ok(fields.unwrap_or_default()),
            _ if fields.is_some() => return Err(at(line, "the front matter holds more than one YAML document")),
            Event::MappingStart(..) => fields = Some(top_level(&mut next)?),
            Event::Scalar(text, TScalarStyle::Plain, ..) if text.is_empty() => fields = Some(Vec::new()),
            Event::Alias(_) => return Err(alias(line)),
            Event::Scalar(..) | Event::SequenceStart(..) | Event::SequenceEnd | Event::MappingEnd => {
                return Err(at(line, "the front matter must be `key: value` lines"));
            }
        }
    }
}

/// The entries of the top-level mapping, its start already read.
fn top_level(next: &mut impl FnMut() -> Result<(Event, Marker), LineError>) -> Result<Vec<Field>, LineError> {
    let mut fields: Vec<Field> = Vec::new();
    loop {
        let (event, mark) = next()?;
        let line = file_line(&mark);
        let key = match event {
            Event::MappingEnd => return Ok(fields),
            Event::Scalar(text, ..) => text,
            Event::Alias(_) => return Err(alias(line)),
            _ => return Err(at(line, "a front-matter key must be a name")),
        };
        let first = next()?;
        let value = node(first, next, 1)?;
        if fields.iter().any(|f| f.key == key) {
            return Err(at(line, format!("the key `{key}` appears twice")));
        }
        fields.push(Field { key, line, value });
    }
}

fn alias(line: usize) -> LineError {
    at(line, "YAML aliases (`*name`) are not supported in agent files")
}

/// The value that starts with `first`.
fn node(
    first: (Event, Marker),
    next: &mut impl FnMut() -> Result<(Event, Marker), LineError>,
    depth: usize,
) -> Result<Node, LineError> {
    let (event, mark) = first;
    let line = file_line(&mark);
    if depth > MAX_DEPTH {
        return Err(at(line, format!("the front matter nests deeper than {MAX_DEPTH} levels")));
    }
    match event {
        Event::Scalar(text, style, ..) => Ok(Node::Scalar { text, plain: style == TScalarStyle::Plain }),
        Event::SequenceStart(..) => {
            let mut items = Vec::new();
            loop {
                let item = next()?;
                if item.0 == Event::SequenceEnd {
                    return Ok(Node::List(items));
                }
                items.push(node(item, next, depth + 1)?);
            }
        }
        Event::MappingStart(..) => {
            let mut entries = Vec::new();
            loop {
                let (event, mark) = next()?;
                let key = match event {
                    Event::MappingEnd => return Ok(Node::Map(entries)),
                    Event::Scalar(text, ..) => text,
                    Event::Alias(_) => return Err(alias(file_line(&mark))),
                    _ => return Err(at(file_line(&mark), "a mapping key must be a name")),
                };
                let first = next()?;
                entries.push((key, node(first, next, depth + 1)?));
            }
        }
        Event::Alias(_) => Err(alias(line)),
        Event::SequenceEnd
        | Event::MappingEnd
        | Event::StreamStart
        | Event::StreamEnd
        | Event::DocumentStart
        | Event::DocumentEnd
        | Event::Nothing => Err(at(line, "a value ends early")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(s: &str) -> Node {
        Node::Scalar { text: s.into(), plain: true }
    }

    #[test]
    fn front_matter_fields_keep_their_lines_and_the_body_follows() {
        let front =
            split("---\nname: review\ntools:\n  - read\n  - grep\nbackground: true\n---\n\nYou review.\n").unwrap();
        let keys: Vec<(&str, usize)> = front.fields.iter().map(|f| (f.key.as_str(), f.line)).collect();
        assert_eq!(keys, [("name", 2), ("tools", 3), ("background", 6)]);
        assert_eq!(front.fields[1].value, Node::List(vec![text("read"), text("grep")]));
        assert_eq!(front.fields[2].value.as_bool(), Some(true));
        assert_eq!(front.body, "You review.");
        let quoted = split("---\nbackground: \"true\"\n---\n").unwrap();
        assert_eq!(quoted.fields[0].value.as_bool(), None, "a quoted true is text");
        assert_eq!(split("---\n---\nbody").unwrap(), Front { fields: Vec::new(), body: "body".into() });
        assert_eq!(split("\u{feff}---\r\nname: x\r\n...\r\n").unwrap().fields[0].value, text("x"));
    }

    #[test]
    fn bad_front_matter_names_its_line() {
        for (file, line, says) in [
            ("no front matter\n", 1, "starts with a `---` line"),
            ("---\nname: x\n", 2, "no closing `---` line"),
            ("---\nname: x\nname: y\n---\n", 3, "appears twice"),
            ("---\na: &anchor [1]\nb: *anchor\n---\n", 3, "aliases"),
            ("---\n- a\n- b\n---\n", 2, "`key: value` lines"),
            ("---\nname: x\n  bad: indent\n---\n", 3, ""),
            ("---\nname: [unclosed\n---\n", 3, ""),
        ] {
            let err = split(file).unwrap_err();
            assert_eq!(err.line, line, "{file:?}: {err:?}");
            assert!(err.message.contains(says), "{file:?}: {err:?}");
        }
        let deep = format!("---\nk: {}{}\n---\n", "[".repeat(MAX_DEPTH + 2), "]".repeat(MAX_DEPTH + 2));
        assert!(split(&deep).unwrap_err().message.contains("nests deeper"), "depth is capped");
    }

    #[test]
    fn nested_values_of_other_tools_are_read_whole() {
        let front = split("---\nhooks:\n  pre:\n    - run: x\nmcpServers: {a: {command: y}}\nname: n\n---\n").unwrap();
        assert_eq!(front.fields.len(), 3);
        assert_eq!(front.fields[2].key, "name");
        assert!(matches!(&front.fields[0].value, Node::Map(entries) if entries[0].0 == "pre"));
    }
}

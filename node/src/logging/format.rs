//! How one log line is written: the text format's fields and the JSON
//! format's lines, both with every field value cut to
//! [`MAX_FIELD_BYTES`] (openraft's state dumps run to kilobytes) and
//! without raw control characters (no escape sequence from a field ever
//! reaches a terminal or a log file).
//!
//! A JSON line is one object: `timestamp` (RFC 3339, UTC), `level`,
//! `target`, `message`, `fields` (the event's other fields) and `spans`
//! (the names of the spans it happened in, outermost first).

use std::fmt;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::format::{FormatEvent, FormatFields, Writer};
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::FmtContext;
use tracing_subscriber::registry::LookupSpan;

/// Longest field value written, in bytes; the rest is replaced by a note
/// of how much was cut.
pub const MAX_FIELD_BYTES: usize = 1_024;

/// Cuts `text` to at most `max` bytes (at a character boundary), noting
/// how many bytes were cut.
pub fn truncate(text: &mut String, max: usize) {
    if text.len() <= max {
        return;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let cut = text.len() - end;
    text.truncate(end);
    text.push_str(&format!("… ({cut} bytes cut)"));
}

/// `text` with control characters (ESC among them) written as `\u{…}`
/// escapes, newlines and tabs as `\n` and `\t`.
pub fn escape_controls(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

fn clean(mut value: String) -> String {
    truncate(&mut value, MAX_FIELD_BYTES);
    escape_controls(&value).into_owned()
}

/// The text format's fields: `message` first as written, then
/// `name=value` pairs, values cut and escaped.
#[derive(Debug, Clone, Copy, Default)]
pub struct TextFields;

impl<'writer> FormatFields<'writer> for TextFields {
    fn format_fields<R: RecordFields>(&self, writer: Writer<'writer>, fields: R) -> fmt::Result {
        let mut visitor = TextVisitor {
            writer,
            first: true,
            result: Ok(()),
        };
        fields.record(&mut visitor);
        visitor.result
    }
}

struct TextVisitor<'writer> {
    writer: Writer<'writer>,
    first: bool,
    result: fmt::Result,
}

impl TextVisitor<'_> {
    fn write(&mut self, field: &Field, value: String) {
        if self.result.is_err() {
            return;
        }
        let separator = if self.first { "" } else { " " };
        self.first = false;
        let value = clean(value);
        self.result = if field.name() == "message" {
            write!(self.writer, "{separator}{value}")
        } else {
            write!(self.writer, "{separator}{}={value}", field.name())
        };
    }
}

impl Visit for TextVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.write(field, value.to_string());
        } else {
            self.write(field, format!("{value:?}"));
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.write(field, format!("{value:?}"));
    }
}

/// One JSON object per line (see the module doc).
#[derive(Debug, Clone, Copy, Default)]
pub struct JsonLines;

impl<S, N> FormatEvent<S, N> for JsonLines
where
    S: Subscriber + for<'lookup> LookupSpan<'lookup>,
    N: for<'writer> FormatFields<'writer> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut timestamp = String::new();
        SystemTime.format_time(&mut Writer::new(&mut timestamp))?;
        let metadata = event.metadata();
        let mut fields = JsonVisitor::default();
        event.record(&mut fields);
        let spans: Vec<Value> = ctx
            .event_scope()
            .map(|scope| {
                scope
                    .from_root()
                    .map(|span| Value::String(span.name().to_string()))
                    .collect()
            })
            .unwrap_or_default();
        let mut line = Map::new();
        line.insert("timestamp".into(), Value::String(timestamp));
        line.insert("level".into(), Value::String(metadata.level().to_string()));
        line.insert(
            "target".into(),
            Value::String(metadata.target().to_string()),
        );
        line.insert(
            "message".into(),
            Value::String(fields.message.unwrap_or_default()),
        );
        line.insert("fields".into(), Value::Object(fields.fields));
        line.insert("spans".into(), Value::Array(spans));
        let text = serde_json::to_string(&Value::Object(line)).map_err(|_| fmt::Error)?;
        writeln!(writer, "{text}")
    }
}

#[derive(Default)]
struct JsonVisitor {
    message: Option<String>,
    fields: Map<String, Value>,
}

impl JsonVisitor {
    fn put(&mut self, field: &Field, value: Value) {
        if field.name() == "message" {
            let text = match value {
                Value::String(text) => text,
                other => other.to_string(),
            };
            let mut text = text;
            truncate(&mut text, MAX_FIELD_BYTES);
            self.message = Some(text);
        } else {
            self.fields.insert(field.name().to_string(), value);
        }
    }
}

impl Visit for JsonVisitor {
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, Value::from(value));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, Value::from(value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, Value::from(value));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(field, Value::from(value));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        let mut text = value.to_string();
        truncate(&mut text, MAX_FIELD_BYTES);
        self.put(field, Value::String(text));
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let mut text = format!("{value:?}");
        truncate(&mut text, MAX_FIELD_BYTES);
        self.put(field, Value::String(text));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn long_values_are_cut_with_a_note() {
        let mut text = "x".repeat(5_000);
        truncate(&mut text, 100);
        assert!(text.starts_with(&"x".repeat(100)));
        assert!(text.ends_with("(4900 bytes cut)"), "{text}");
    }

    #[test]
    fn escape_sequences_never_survive() {
        let escaped = escape_controls("key\u{1b}[31mred\u{1b}[0m\nnext");
        assert!(!escaped.contains('\u{1b}'));
        assert_eq!(escaped, "key\\u{1b}[31mred\\u{1b}[0m\\nnext");
    }

    proptest! {
        #[test]
        fn truncation_keeps_a_prefix_on_a_char_boundary(text in ".{0,300}", max in 0usize..200) {
            let mut cut = text.clone();
            truncate(&mut cut, max);
            if text.len() <= max {
                prop_assert_eq!(cut, text);
            } else {
                let kept = cut.split('…').next().unwrap_or_default();
                prop_assert!(kept.len() <= max);
                prop_assert!(text.starts_with(kept));
            }
        }

        #[test]
        fn escaped_text_has_no_control_characters(text in "\\PC{0,40}[\u{0}-\u{1f}\u{7f}]{0,5}") {
            prop_assert!(!escape_controls(&text).chars().any(char::is_control));
        }
    }
}

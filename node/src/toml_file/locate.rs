//! Where a field is written in a TOML text: the line of a key at the top
//! level, in a `[table]`, or in the n-th `[[array]]` table, the line of
//! a byte offset (for the parser's own errors) and the field written there. Best effort over plain
//! `key = value` lines, which is how every Leasehold file is written; a
//! key it cannot find simply has no line.

/// Which table of the file a key lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Section<'a> {
    /// Before any table header.
    Top,
    /// `[name]`.
    Table(&'a str),
    /// The `index`-th (from 0) `[[name]]`.
    ArrayEntry(&'a str, usize),
}

/// The 1-based line of byte `offset` in `text`.
pub fn line_of_offset(text: &str, offset: usize) -> usize {
    line_and_column(text, offset).0
}

/// The 1-based line and column (in characters) of byte `offset` in `text`.
pub fn line_and_column(text: &str, offset: usize) -> (usize, usize) {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line = before.bytes().filter(|b| *b == b'\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |newline| newline + 1);
    (line, before[line_start..].chars().count() + 1)
}

/// The 1-based line where `key` is assigned in `section`, if found; with
/// no key, the line of the section's header.
pub fn line_of(text: &str, section: Section<'_>, key: Option<&str>) -> Option<usize> {
    lines(text)
        .find(|line| {
            line.section == section
                && match key {
                    None => line.header,
                    Some(key) => !line.header && assigns(line.text, key),
                }
        })
        .map(|line| line.number)
}

/// What is written at byte `offset` of `text`: the section of its line and
/// the key that line assigns (`None` on a table's header, or on a line
/// that assigns no bare key).
pub fn field_at(text: &str, offset: usize) -> (Section<'_>, Option<&str>) {
    let number = line_of_offset(text, offset);
    let Some(line) = lines(text).find(|line| line.number == number) else {
        return (Section::Top, None);
    };
    let key = (!line.header)
        .then(|| line.text.split_once('='))
        .flatten()
        .map(|(key, _)| key.trim().trim_matches('"'))
        .filter(|key| !key.is_empty());
    (line.section, key)
}

/// One line of a TOML text, in the section it belongs to.
struct Line<'a> {
    /// 1-based.
    number: usize,
    /// The line without surrounding blanks.
    text: &'a str,
    /// Its section (a header line opens its own).
    section: Section<'a>,
    /// Whether the line is a table header.
    header: bool,
}

/// Every line of `text` with its section.
fn lines(text: &str) -> impl Iterator<Item = Line<'_>> {
    let mut current = Section::Top;
    let mut seen_entries: Vec<(&str, usize)> = Vec::new();
    text.lines().enumerate().map(move |(number, raw)| {
        let line = raw.trim();
        let mut header = true;
        if let Some(name) = line
            .strip_prefix("[[")
            .and_then(|rest| rest.split("]]").next())
        {
            let name = name.trim();
            let index = match seen_entries.iter_mut().find(|(n, _)| *n == name) {
                Some((_, count)) => {
                    *count += 1;
                    *count - 1
                }
                None => {
                    seen_entries.push((name, 1));
                    0
                }
            };
            current = Section::ArrayEntry(name, index);
        } else if let Some(name) = line
            .strip_prefix('[')
            .and_then(|rest| rest.split(']').next())
        {
            current = Section::Table(name.trim());
        } else {
            header = false;
        }
        Line {
            number: number + 1,
            text: line,
            section: current,
            header,
        }
    })
}

/// Whether `line` assigns `key` (bare or quoted).
fn assigns(line: &str, key: &str) -> bool {
    let rest = if let Some(rest) = line.strip_prefix(key) {
        rest
    } else if let Some(rest) = line
        .strip_prefix('"')
        .and_then(|l| l.strip_prefix(key))
        .and_then(|l| l.strip_prefix('"'))
    {
        rest
    } else {
        return false;
    };
    rest.trim_start().starts_with('=')
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "id = 1\nlisten=\"x\"\n\n[fair_throttle]\nlevels = 3\n[[policy]]\nlimit = 1\n[[policy]]\n\"limit\" = 2\nlimits = 3\n";

    #[test]
    fn keys_are_found_in_their_section() {
        assert_eq!(line_of(TEXT, Section::Top, Some("id")), Some(1));
        assert_eq!(line_of(TEXT, Section::Top, Some("listen")), Some(2));
        assert_eq!(line_of(TEXT, Section::Top, Some("levels")), None);
        assert_eq!(
            line_of(TEXT, Section::Table("fair_throttle"), Some("levels")),
            Some(5)
        );
        assert_eq!(
            line_of(TEXT, Section::ArrayEntry("policy", 0), Some("limit")),
            Some(7)
        );
        assert_eq!(
            line_of(TEXT, Section::ArrayEntry("policy", 1), Some("limit")),
            Some(9)
        );
        assert_eq!(
            line_of(TEXT, Section::ArrayEntry("policy", 1), Some("limits")),
            Some(10)
        );
        assert_eq!(
            line_of(TEXT, Section::ArrayEntry("policy", 1), None),
            Some(8)
        );
        assert_eq!(line_of(TEXT, Section::ArrayEntry("policy", 2), None), None);
    }

    #[test]
    fn offsets_map_to_the_field_written_there() {
        assert_eq!(field_at(TEXT, 0), (Section::Top, Some("id")));
        let levels = TEXT.find("levels").unwrap();
        assert_eq!(
            field_at(TEXT, levels + 3),
            (Section::Table("fair_throttle"), Some("levels"))
        );
        let second = TEXT.find("\"limit\"").unwrap();
        assert_eq!(
            field_at(TEXT, second),
            (Section::ArrayEntry("policy", 1), Some("limit"))
        );
        let header = TEXT.find("[fair_throttle]").unwrap();
        assert_eq!(
            field_at(TEXT, header),
            (Section::Table("fair_throttle"), None)
        );
        assert_eq!(field_at(TEXT, 10_000), (Section::Top, None));
    }

    #[test]
    fn offsets_map_to_lines() {
        assert_eq!(line_of_offset(TEXT, 0), 1);
        assert_eq!(line_of_offset(TEXT, 7), 2);
        assert_eq!(line_of_offset(TEXT, 10_000), TEXT.lines().count() + 1);
        assert_eq!(line_and_column(TEXT, 0), (1, 1));
        assert_eq!(line_and_column(TEXT, 9), (2, 3));
        assert_eq!(line_and_column("é = 1", 3), (1, 3));
        assert_eq!(line_and_column("é = 1", 1), (1, 1));
    }
}

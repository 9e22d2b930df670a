//! Where a field is written in a TOML text: the line of a key at the top
//! level, in a `[table]`, or in the n-th `[[array]]` table, and the line of
//! a byte offset (for the parser's own errors). Best effort over plain
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
    let offset = offset.min(text.len());
    text.as_bytes()[..offset]
        .iter()
        .filter(|b| **b == b'\n')
        .count()
        + 1
}

/// The 1-based line where `key` is assigned in `section`, if found; with
/// no key, the line of the section's header.
pub fn line_of(text: &str, section: Section<'_>, key: Option<&str>) -> Option<usize> {
    let mut current = Section::Top;
    let mut seen_entries: Vec<(&str, usize)> = Vec::new();
    for (number, raw) in text.lines().enumerate() {
        let line = raw.trim();
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
        } else if current == section {
            if let Some(key) = key {
                if assigns(line, key) {
                    return Some(number + 1);
                }
            }
            continue;
        } else {
            continue;
        }
        if current == section && key.is_none() {
            return Some(number + 1);
        }
    }
    None
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
    fn offsets_map_to_lines() {
        assert_eq!(line_of_offset(TEXT, 0), 1);
        assert_eq!(line_of_offset(TEXT, 7), 2);
        assert_eq!(line_of_offset(TEXT, 10_000), TEXT.lines().count() + 1);
    }
}

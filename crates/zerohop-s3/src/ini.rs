//! The AWS shared files' format (`~/.aws/config`, `~/.aws/credentials`):
//! `[section]` headers, `key = value` lines, `#` and `;` comments, and one
//! level of nesting (a key with no value, followed by indented
//! `key = value` lines, e.g. `s3 =` then `  addressing_style = path`),
//! read here as `s3.addressing_style`. These files may come from anywhere:
//! the parser refuses what it does not understand, with the line, and never
//! panics (`fuzz/fuzz_targets/aws_config.rs`).

use std::collections::HashMap;

/// Larger files are refused: real ones are a few KiB.
pub const MAX_BYTES: usize = 1 << 20;

/// Each section's settings, by section name as written (`default`,
/// `profile name`, or for the credentials file just `name`).
pub type Sections = HashMap<String, HashMap<String, String>>;

/// Parses the text of an AWS config or credentials file.
pub fn parse(text: &str) -> Result<Sections, String> {
    if text.len() > MAX_BYTES {
        return Err(format!("larger than {MAX_BYTES} bytes"));
    }
    let mut sections = Sections::new();
    let mut section: Option<String> = None;
    // The key whose indented lines follow (`s3 =`).
    let mut parent: Option<String> = None;
    for (n, line) in text.lines().enumerate() {
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with(['#', ';']) {
            continue;
        }
        let at = |what: &str| format!("line {}: {what}", n + 1);
        if let Some(name) = trimmed.strip_prefix('[') {
            let name = name
                .strip_suffix(']')
                .ok_or_else(|| at("a section header must end with ']'"))?
                .trim();
            if name.is_empty() {
                return Err(at("a section needs a name"));
            }
            sections.entry(name.to_string()).or_default();
            section = Some(name.to_string());
            parent = None;
            continue;
        }
        let Some(current) = &section else {
            return Err(at("a setting before any [section]"));
        };
        let (key, value) = trimmed
            .split_once('=')
            .ok_or_else(|| at("expected 'key = value'"))?;
        let (key, value) = (key.trim(), value.trim());
        if key.is_empty() {
            return Err(at("a setting needs a name"));
        }
        let indented = line.starts_with([' ', '\t']);
        let settings = sections.entry(current.clone()).or_default();
        match (&parent, indented) {
            (Some(p), true) => {
                settings.insert(format!("{p}.{key}"), value.to_string());
            }
            _ if value.is_empty() => parent = Some(key.to_string()),
            _ => {
                parent = None;
                settings.insert(key.to_string(), value.to_string());
            }
        }
    }
    Ok(sections)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_settings_and_nested_settings() {
        let text = "\
# comment
[default]
region = eu-west-1
s3 =
  addressing_style = path
  endpoint_url = http://127.0.0.1:9000
aws_access_key_id=AKIA
; another comment

[profile other]
region=us-east-2
";
        let s = parse(text).unwrap();
        let d = &s["default"];
        assert_eq!(d["region"], "eu-west-1");
        assert_eq!(d["s3.addressing_style"], "path");
        assert_eq!(d["s3.endpoint_url"], "http://127.0.0.1:9000");
        assert_eq!(d["aws_access_key_id"], "AKIA");
        assert_eq!(s["profile other"]["region"], "us-east-2");
    }

    #[test]
    fn malformed_files_say_which_line() {
        for (text, line) in [
            ("region = x\n", "line 1"),
            ("[default\n", "line 1"),
            ("[default]\n\nnot a setting\n", "line 3"),
            ("[]\n", "line 1"),
            ("[d]\n = v\n", "line 2"),
        ] {
            let e = parse(text).unwrap_err();
            assert!(e.starts_with(line), "{text:?}: {e}");
        }
        assert!(parse(&"#".repeat(MAX_BYTES + 1)).is_err());
    }
}

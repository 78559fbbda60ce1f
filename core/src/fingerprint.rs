//! SQL fingerprints: a template id for queries submitted as text.
//!
//! Queries that differ only in literal values, letter case, whitespace or
//! comments get the same fingerprint, so the predictor learns per query
//! shape, as it does per TPC-DS template. Fingerprints live at or above
//! [`FINGERPRINT_BASE`], apart from the small ids of named templates.
//!
//! # Properties
//!
//! - (A) Replacing a number or a quoted string with another leaves the
//!   fingerprint unchanged; so do case, whitespace and comments.
//! - (B) The fingerprint is at least [`FINGERPRINT_BASE`].
//! - (C) A [`SqlCatalog`] gives SQL text whose fingerprint matches a
//!   named template's text that template's id, so a TPC-DS query sent as
//!   text and the same query sent as its template number are one template
//!   to the predictor; any other text keeps its fingerprint.

use std::collections::HashMap;
use std::sync::Arc;

use crate::model::TemplateId;

/// The SQL text of named templates (a pool's query catalog, e.g. the 99
/// TPC-DS queries as ids 1–99), for backends that run SQL.
#[derive(Clone, Debug, Default)]
pub struct SqlCatalog {
    texts: HashMap<TemplateId, Arc<str>>,
    by_fingerprint: HashMap<TemplateId, TemplateId>,
}

impl SqlCatalog {
    /// A catalog of `(template, text)` pairs.
    ///
    /// # Panics
    ///
    /// If a template id is not below [`FINGERPRINT_BASE`] (it would be
    /// mistaken for a fingerprint).
    pub fn new(entries: impl IntoIterator<Item = (TemplateId, String)>) -> Self {
        let mut catalog = SqlCatalog::default();
        for (template, text) in entries {
            assert!(template.0 < FINGERPRINT_BASE, "named template {template} collides with the fingerprint range");
            catalog.by_fingerprint.insert(fingerprint_sql(&text), template);
            catalog.texts.insert(template, Arc::from(text));
        }
        catalog
    }

    /// Templates in the catalog.
    pub fn len(&self) -> usize {
        self.texts.len()
    }

    /// Whether the catalog is empty.
    pub fn is_empty(&self) -> bool {
        self.texts.is_empty()
    }

    /// The template a submission is, and the SQL to run for it: the
    /// client's text when it sent text (under its named template's id when
    /// it matches one), else the catalog's text for the named template.
    pub fn resolve(&self, template: TemplateId, sql: Option<Arc<str>>) -> (TemplateId, Option<Arc<str>>) {
        match sql {
            Some(text) => (self.by_fingerprint.get(&template).copied().unwrap_or(template), Some(text)),
            None => (template, self.texts.get(&template).cloned()),
        }
    }
}

/// The smallest fingerprint id; named templates stay below it.
pub const FINGERPRINT_BASE: u32 = 1 << 24;

/// The normalised text a fingerprint is computed from: lower case, literals
/// replaced by `?`, comments dropped, whitespace collapsed.
pub fn normalise_sql(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut chars = sql.chars().peekable();
    let mut last_space = true;
    let push = |out: &mut String, c: char, last_space: &mut bool| {
        if c.is_whitespace() {
            if !*last_space {
                out.push(' ');
                *last_space = true;
            }
        } else {
            out.extend(c.to_lowercase());
            *last_space = false;
        }
    };
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                // A string literal, with '' as an escaped quote.
                loop {
                    match chars.next() {
                        Some('\'') if chars.peek() == Some(&'\'') => {
                            chars.next();
                        }
                        Some('\'') | None => break,
                        Some(_) => {}
                    }
                }
                push(&mut out, '?', &mut last_space);
            }
            '-' if chars.peek() == Some(&'-') => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        break;
                    }
                }
                push(&mut out, ' ', &mut last_space);
            }
            '/' if chars.peek() == Some(&'*') => {
                chars.next();
                let mut previous = ' ';
                for c in chars.by_ref() {
                    if previous == '*' && c == '/' {
                        break;
                    }
                    previous = c;
                }
                push(&mut out, ' ', &mut last_space);
            }
            c if c.is_ascii_digit() && !out.ends_with(|p: char| p.is_alphanumeric() || p == '_') => {
                while chars.peek().is_some_and(|c| c.is_ascii_digit() || *c == '.') {
                    chars.next();
                }
                push(&mut out, '?', &mut last_space);
            }
            c => push(&mut out, c, &mut last_space),
        }
    }
    out.trim().to_owned()
}

/// The fingerprint of `sql`.
pub fn fingerprint_sql(sql: &str) -> TemplateId {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in normalise_sql(sql).bytes() {
        hash = (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    let span = u64::from(u32::MAX - FINGERPRINT_BASE) + 1;
    TemplateId(FINGERPRINT_BASE + (hash % span) as u32)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn literals_case_whitespace_and_comments_do_not_matter() {
        let a = fingerprint_sql("SELECT * FROM sales WHERE year = 2001 AND state = 'TX'");
        let b = fingerprint_sql("select *\n  from sales -- yearly\n where year = 1999 and state = 'it''s' /* x */");
        assert_eq!(a, b);
    }

    #[test]
    fn different_shapes_get_different_fingerprints() {
        assert_ne!(fingerprint_sql("select a from t"), fingerprint_sql("select b from t"));
        assert_ne!(fingerprint_sql("select * from t1"), fingerprint_sql("select * from t2"));
    }

    #[test]
    fn catalog_text_takes_its_templates_id_and_a_template_number_gets_its_text() {
        let catalog = SqlCatalog::new([(TemplateId(17), "select * from store_sales where ss_quantity > 10".to_owned())]);
        let sent = "SELECT * FROM store_sales WHERE ss_quantity > 99";
        let (template, sql) = catalog.resolve(fingerprint_sql(sent), Some(Arc::from(sent)));
        assert_eq!((template, sql.as_deref()), (TemplateId(17), Some(sent)));
        let (template, sql) = catalog.resolve(TemplateId(17), None);
        assert_eq!((template, sql.as_deref()), (TemplateId(17), Some("select * from store_sales where ss_quantity > 10")));
        let other = fingerprint_sql("select 1");
        assert_eq!(catalog.resolve(other, Some(Arc::from("select 1"))).0, other);
        assert_eq!(catalog.resolve(TemplateId(18), None), (TemplateId(18), None));
    }

    proptest! {
        #[test]
        fn numbers_and_strings_are_interchangeable(n in 0u64..1_000_000, s in "[a-z ]{0,12}") {
            let a = fingerprint_sql(&format!("select x from t where n = {n} and s = '{s}'"));
            let b = fingerprint_sql("select x from t where n = 7 and s = 'q'");
            prop_assert_eq!(a, b);
            prop_assert!(a.0 >= FINGERPRINT_BASE);
        }
    }
}

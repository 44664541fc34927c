//! The hostile statements' text, drawn from a seeded generator: statements nested thousands
//! deep or megabytes long ([`deep`]), queries that ask for more memory or time than a
//! statement may have ([`hungry`]), and the endless queries the cancel clients stop. Each
//! comes with what may answer it: the SQLSTATEs its case allows and whether a result is
//! allowed too (a statement whose failure does not depend on the server's limits must fail).

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;

/// A cross join of 10^14 rows, counted: it computes for hours and returns one row.
pub const RUNAWAY: &str = "SELECT count(*) FROM generate_series(1, 1000000) AS a(x), \
                           generate_series(1, 100000000) AS b(y)";
/// A recursive CTE without a bound, counted: it never answers.
pub const ENDLESS_COUNT: &str =
    "WITH RECURSIVE t(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM t) SELECT count(*) FROM t";
/// A recursive CTE without a bound: it streams rows forever.
pub const ENDLESS_ROWS: &str =
    "WITH RECURSIVE t(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM t) SELECT n FROM t";

/// Outcomes any hostile statement may have besides its own: a cancel by timeout.
pub const QUERY_CANCELED: &str = "57014";

/// One hostile statement.
#[derive(Clone, Debug)]
pub struct Hostile {
    /// The case, for the report (`plus chain`, `repeat 2^31-1`...).
    pub case: &'static str,
    pub sql: String,
    /// SQLSTATEs that may answer it.
    pub errors: &'static [&'static str],
    /// Whether a result may answer it.
    pub may_succeed: bool,
    /// A `statement_timeout` the session sets just for it.
    pub timeout: Option<&'static str>,
}

impl Hostile {
    /// Whether SQLSTATE `code` is an allowed answer.
    pub fn allows(&self, code: &str) -> bool {
        self.errors.contains(&code)
    }

    /// The start of the text, for reports.
    pub fn excerpt(&self) -> String {
        let head: String = self.sql.chars().take(80).collect();
        if self.sql.len() > head.len() {
            format!("{} ({} bytes): {head}…", self.case, self.sql.len())
        } else {
            format!("{}: {head}", self.case)
        }
    }
}

/// What may answer a deep statement: too complex, a syntax error, too large, a timeout, out
/// of memory — or a result.
const DEEP_ERRORS: &[&str] = &["54001", "42601", "54000", QUERY_CANCELED, "53200"];
/// What may answer a memory-hungry query.
const HUNGRY_ERRORS: &[&str] = &["53200", "54000", QUERY_CANCELED, "53100"];

fn chain(n: usize, term: &str, op: &str) -> String {
    vec![term; n].join(op)
}

/// A statement nested deep (thousands of terms, hundreds of set operations or CTEs, arrays
/// ~60 deep, ~1,000 brackets) or 1–4 MB long.
pub fn deep(rng: &mut StdRng) -> Hostile {
    let (case, sql) = match rng.gen_range(0..8) {
        0 => (
            "plus chain",
            format!("SELECT {}", chain(rng.gen_range(1500..6000), "1", "+")),
        ),
        1 => (
            "AND chain",
            format!(
                "SELECT {}",
                chain(rng.gen_range(1500..6000), "true", " AND ")
            ),
        ),
        2 => (
            "UNION ALL chain",
            chain(rng.gen_range(200..900), "SELECT 1", " UNION ALL "),
        ),
        3 => {
            let n = rng.gen_range(100..1200);
            let ctes: Vec<String> = (1..=n)
                .map(|i| format!("c{i} AS (SELECT x FROM c{})", i - 1))
                .collect();
            (
                "chained CTEs",
                format!(
                    "WITH c0 AS (SELECT 1 AS x), {} SELECT x FROM c{n}",
                    ctes.join(", ")
                ),
            )
        }
        4 => {
            let depth = rng.gen_range(40..70);
            let tail = *["1", "1", "1 +", "1 AS"].choose(rng).unwrap_or(&"1");
            (
                "nested ARRAY",
                format!(
                    "SELECT {}{tail}{}",
                    "ARRAY[".repeat(depth),
                    "]".repeat(depth)
                ),
            )
        }
        5 => {
            let depth = rng.gen_range(900..1100);
            (
                "nested brackets",
                format!("SELECT {}1{}", "(".repeat(depth), ")".repeat(depth)),
            )
        }
        6 => (
            "product chain",
            format!("SELECT {}", chain(rng.gen_range(5000..20000), "2", "*")),
        ),
        _ => large(rng),
    };
    Hostile {
        case,
        sql,
        errors: DEEP_ERRORS,
        may_succeed: true,
        timeout: None,
    }
}

/// A statement of 1–4 MB: a string literal, a comment, an `IN` list or a `VALUES` list.
fn large(rng: &mut StdRng) -> (&'static str, String) {
    let bytes = rng.gen_range(1 << 20..4 << 20);
    match rng.gen_range(0..4) {
        0 => (
            "large literal",
            format!("SELECT length('{}')", "x".repeat(bytes)),
        ),
        1 => (
            "large comment",
            format!("SELECT 1 -- {}\n", "c".repeat(bytes)),
        ),
        2 => {
            // ~8 bytes an item
            let items: Vec<String> = (0..bytes / 8)
                .map(|i| (i + 1_000_000).to_string())
                .collect();
            (
                "large IN list",
                format!("SELECT 1 WHERE 7 IN ({})", items.join(",")),
            )
        }
        _ => {
            let items: Vec<String> = (0..bytes / 10)
                .map(|i| format!("({})", i + 1_000_000))
                .collect();
            (
                "large VALUES list",
                format!("SELECT count(*) FROM (VALUES {}) AS t(a)", items.join(",")),
            )
        }
    }
}

/// A query that asks for more memory (or time) than a statement may have.
pub fn hungry(rng: &mut StdRng) -> Hostile {
    let (case, sql, may_succeed, timeout) = match rng.gen_range(0..9) {
        0 => (
            "count(DISTINCT) over w x w",
            "SELECT count(DISTINCT a.k * 1000003 + b.k) FROM w a, w b".to_string(),
            true,
            None,
        ),
        1 => {
            let n = rng.gen_range(3000..20000);
            (
                "count(DISTINCT) over a series cross join",
                format!(
                    "SELECT count(DISTINCT a * 100003 + b) \
                     FROM generate_series(1, {n}) AS x(a), generate_series(1, {n}) AS y(b)"
                ),
                true,
                None,
            )
        }
        2 => (
            "repeat 2^31-1",
            "SELECT length(repeat('x', 2147483647))".to_string(),
            false,
            None,
        ),
        3 => (
            "lpad 2^31-1",
            "SELECT length(lpad('x', 2147483647, 'ab'))".to_string(),
            false,
            None,
        ),
        4 => {
            let n = rng.gen_range(1_000_000..8_000_000);
            (
                "big sort",
                format!(
                    "SELECT max(r) FROM (SELECT row_number() OVER (ORDER BY md5(v::text)) AS r \
                     FROM generate_series(1, {n}) AS t(v)) AS s"
                ),
                true,
                None,
            )
        }
        5 => {
            let n = rng.gen_range(20_000_000..300_000_000);
            (
                "array_agg over a series",
                format!("SELECT cardinality(array_agg(v)) FROM generate_series(1, {n}) AS t(v)"),
                true,
                None,
            )
        }
        6 => {
            let n = rng.gen_range(200_000..3_000_000);
            (
                "string_agg of 1 KB values",
                format!(
                    "SELECT length(string_agg(repeat('x', 1000), '')) \
                     FROM generate_series(1, {n}) AS t(v)"
                ),
                true,
                None,
            )
        }
        7 => (
            "recursive CTE without limit",
            ENDLESS_COUNT.to_string(),
            false,
            Some("2s"),
        ),
        _ => (
            "range over 3e9",
            "SELECT cardinality(range(1, 3000000000))".to_string(),
            false,
            None,
        ),
    };
    Hostile {
        case,
        sql,
        errors: HUNGRY_ERRORS,
        may_succeed,
        timeout,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn the_generators_cover_every_case_and_stay_bounded() {
        let mut rng = StdRng::seed_from_u64(7);
        let mut cases = std::collections::BTreeSet::new();
        for _ in 0..300 {
            let d = deep(&mut rng);
            assert!(d.sql.len() < 5 << 20, "{}", d.case);
            assert!(d.may_succeed && d.allows("54001"));
            cases.insert(d.case);
            let h = hungry(&mut rng);
            assert!(h.allows("53200") && h.allows("57014"));
            cases.insert(h.case);
        }
        assert_eq!(cases.len(), 7 + 4 + 9, "{cases:?}");
    }

    #[test]
    fn large_statements_are_one_to_four_megabytes() {
        let mut rng = StdRng::seed_from_u64(1);
        for _ in 0..20 {
            let (case, sql) = large(&mut rng);
            assert!(
                sql.len() > 900_000 && sql.len() < 4_300_000,
                "{case}: {}",
                sql.len()
            );
        }
    }

    #[test]
    fn excerpts_are_short() {
        let mut rng = StdRng::seed_from_u64(3);
        let (case, sql) = large(&mut rng);
        let h = Hostile {
            case,
            sql,
            errors: DEEP_ERRORS,
            may_succeed: true,
            timeout: None,
        };
        assert!(h.excerpt().len() < 200);
    }
}

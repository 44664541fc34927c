//! Correlated scalar subqueries whose correlation is not an equality, checked against brute force.
//!
//! This is the adversarial check of `sql/src/system/decorrelate.rs`. That rewrite answers
//! `SELECT o.id, (SELECT count(*) FROM ct AS x WHERE x.b < o.b) FROM ct AS o` with a LEFT JOIN
//! against a table grouped over the outer values' domain, and must still give PostgreSQL's
//! per-row answer: `count(*)` and `count(1)` are 0 where no inner row matches and every other
//! aggregate is NULL there, a NULL outer value matches nothing, and every outer row is kept
//! exactly once. A fixed seed loads a small table `ct` and a stream `cs` (small ints, many
//! duplicates and NULLs) and generates random queries: an aggregate over `ct` or `cs` in the
//! select list or compared with a constant in WHERE, its condition one or two comparisons of
//! inner and outer columns joined by AND or OR (at least one not an equality, outer sides
//! sometimes shifted by one), sometimes with an equality, a BETWEEN of outer columns or a
//! literal bound as a further conjunct. The expected answer is computed here by evaluating
//! the subquery for every outer row under SQL's three-valued logic; every query whose answer
//! differs (or fails) is reported with its SQL.
//! Longer: `SLUICE_SUBQUERY_CASES=5000 cargo test -p sluice-tests --test subqueries`.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sluice_tests::{error_message, exec, simple_rows, sqlstate, try_simple_rows, Server};
use tokio_postgres::Client;

const SEED: u64 = 22;
/// The value columns; the stream `cs` has only the first two.
const COLUMNS: [&str; 3] = ["a", "b", "c"];
const CT_ROWS: i64 = 30;
const CS_ROWS: usize = 15;
/// At most this many differing queries are shown in the failure message.
const SHOWN: usize = 10;

type Rows = Vec<Vec<Option<String>>>;
/// One row's `a`, `b`, `c` (a stream row's `c` is NULL and never read).
type Row = [Option<i64>; 3];

#[derive(Clone, Copy)]
enum Op {
    Lt,
    Le,
    Gt,
    Ge,
    Ne,
    Eq,
}

const NOT_EQUAL: [Op; 5] = [Op::Lt, Op::Le, Op::Gt, Op::Ge, Op::Ne];
const ANY_OP: [Op; 6] = [Op::Lt, Op::Le, Op::Gt, Op::Ge, Op::Ne, Op::Eq];

impl Op {
    fn sql(self) -> &'static str {
        match self {
            Op::Lt => "<",
            Op::Le => "<=",
            Op::Gt => ">",
            Op::Ge => ">=",
            Op::Ne => "<>",
            Op::Eq => "=",
        }
    }

    /// `l op r`: unknown (`None`) when either side is NULL.
    fn apply(self, l: Option<i64>, r: Option<i64>) -> Option<bool> {
        let (l, r) = (l?, r?);
        Some(match self {
            Op::Lt => l < r,
            Op::Le => l <= r,
            Op::Gt => l > r,
            Op::Ge => l >= r,
            Op::Ne => l != r,
            Op::Eq => l == r,
        })
    }
}

#[derive(Clone, Copy)]
enum Operand {
    /// A column of the subquery's relation `x`.
    Inner(usize),
    /// A column of the outer row `o`, plus a constant.
    Outer(usize, i64),
    Literal(i64),
}

impl Operand {
    fn sql(self) -> String {
        match self {
            Operand::Inner(c) => format!("x.{}", COLUMNS[c]),
            Operand::Outer(c, 0) => format!("o.{}", COLUMNS[c]),
            Operand::Outer(c, k) if k > 0 => format!("o.{} + {k}", COLUMNS[c]),
            Operand::Outer(c, k) => format!("o.{} - {}", COLUMNS[c], -k),
            Operand::Literal(k) => k.to_string(),
        }
    }

    fn eval(self, inner: &Row, outer: &Row) -> Option<i64> {
        match self {
            Operand::Inner(c) => inner[c],
            Operand::Outer(c, k) => outer[c].map(|v| v + k),
            Operand::Literal(k) => Some(k),
        }
    }
}

/// The subquery's WHERE.
enum Cond {
    Cmp(Operand, Op, Operand),
    /// `v BETWEEN lo AND hi`, which is `v >= lo AND v <= hi`.
    Between(Operand, Operand, Operand),
    And(Box<Cond>, Box<Cond>),
    Or(Box<Cond>, Box<Cond>),
}

/// SQL's AND: FALSE wins over unknown.
fn and3(l: Option<bool>, r: Option<bool>) -> Option<bool> {
    match (l, r) {
        (Some(false), _) | (_, Some(false)) => Some(false),
        (Some(true), Some(true)) => Some(true),
        _ => None,
    }
}

/// SQL's OR: TRUE wins over unknown.
fn or3(l: Option<bool>, r: Option<bool>) -> Option<bool> {
    match (l, r) {
        (Some(true), _) | (_, Some(true)) => Some(true),
        (Some(false), Some(false)) => Some(false),
        _ => None,
    }
}

impl Cond {
    fn sql(&self) -> String {
        match self {
            Cond::Cmp(l, op, r) => format!("{} {} {}", l.sql(), op.sql(), r.sql()),
            Cond::Between(v, lo, hi) => {
                format!("{} BETWEEN {} AND {}", v.sql(), lo.sql(), hi.sql())
            }
            Cond::And(l, r) => format!("{} AND {}", l.nested(), r.nested()),
            Cond::Or(l, r) => format!("{} OR {}", l.nested(), r.nested()),
        }
    }

    /// As an operand of AND or OR: parenthesized when it is one itself.
    fn nested(&self) -> String {
        match self {
            Cond::And(..) | Cond::Or(..) => format!("({})", self.sql()),
            _ => self.sql(),
        }
    }

    fn eval(&self, inner: &Row, outer: &Row) -> Option<bool> {
        match self {
            Cond::Cmp(l, op, r) => op.apply(l.eval(inner, outer), r.eval(inner, outer)),
            Cond::Between(v, lo, hi) => {
                let v = v.eval(inner, outer);
                and3(
                    Op::Ge.apply(v, lo.eval(inner, outer)),
                    Op::Le.apply(v, hi.eval(inner, outer)),
                )
            }
            Cond::And(l, r) => and3(l.eval(inner, outer), r.eval(inner, outer)),
            Cond::Or(l, r) => or3(l.eval(inner, outer), r.eval(inner, outer)),
        }
    }
}

/// The subquery's one output column (the `usize` is an inner column).
#[derive(Clone, Copy)]
enum Agg {
    CountStar,
    CountOne,
    CountStarPlusOne,
    Count(usize),
    Sum(usize),
    Min(usize),
    Max(usize),
}

impl Agg {
    fn sql(self) -> String {
        match self {
            Agg::CountStar => "count(*)".into(),
            Agg::CountOne => "count(1)".into(),
            Agg::CountStarPlusOne => "count(*) + 1".into(),
            Agg::Count(c) => format!("count(x.{})", COLUMNS[c]),
            Agg::Sum(c) => format!("sum(x.{})", COLUMNS[c]),
            Agg::Min(c) => format!("min(x.{})", COLUMNS[c]),
            Agg::Max(c) => format!("max(x.{})", COLUMNS[c]),
        }
    }

    /// The value over the inner rows the condition accepted (maybe none).
    fn eval(self, matched: &[&Row]) -> Option<i64> {
        let n = matched.len() as i64;
        match self {
            Agg::CountStar | Agg::CountOne => Some(n),
            Agg::CountStarPlusOne => Some(n + 1),
            Agg::Count(c) => Some(non_null(matched, c).len() as i64),
            Agg::Sum(c) => non_null(matched, c).into_iter().reduce(|a, b| a + b),
            Agg::Min(c) => non_null(matched, c).into_iter().min(),
            Agg::Max(c) => non_null(matched, c).into_iter().max(),
        }
    }
}

/// Column `c`'s non-NULL values in `rows`.
fn non_null(rows: &[&Row], c: usize) -> Vec<i64> {
    rows.iter().filter_map(|r| r[c]).collect()
}

/// What the queries read: `ct`'s rows (ids in order) and `cs`'s.
struct Data {
    ids: Vec<i64>,
    ct: Vec<Row>,
    cs: Vec<Row>,
}

/// One generated query.
struct Case {
    /// The subquery reads the stream `cs` (else the table `ct`).
    stream: bool,
    agg: Agg,
    cond: Cond,
    /// The subquery sits in WHERE, compared with a constant; `None`: in the select list.
    filter: Option<(Op, i64)>,
}

impl Case {
    fn sql(&self) -> String {
        let sub = format!(
            "(SELECT {} FROM {} AS x WHERE {})",
            self.agg.sql(),
            if self.stream { "cs" } else { "ct" },
            self.cond.sql()
        );
        match self.filter {
            None => format!("SELECT o.id, {sub} FROM ct AS o ORDER BY o.id"),
            Some((op, k)) => format!(
                "SELECT o.id FROM ct AS o WHERE {sub} {} {k} ORDER BY o.id",
                op.sql()
            ),
        }
    }

    /// The answer by brute force: the subquery evaluated for every outer row.
    fn expected(&self, data: &Data) -> Rows {
        let inner = if self.stream { &data.cs } else { &data.ct };
        let mut rows = Vec::new();
        for (id, outer) in data.ids.iter().zip(&data.ct) {
            let matched: Vec<&Row> = inner
                .iter()
                .filter(|r| self.cond.eval(r, outer) == Some(true))
                .collect();
            let value = self.agg.eval(&matched);
            match self.filter {
                None => rows.push(vec![Some(id.to_string()), value.map(|v| v.to_string())]),
                Some((op, k)) if op.apply(value, Some(k)) == Some(true) => {
                    rows.push(vec![Some(id.to_string())])
                }
                Some(_) => {}
            }
        }
        rows
    }
}

/// A small int, NULL one time in five.
fn value(rng: &mut StdRng) -> Option<i64> {
    if rng.gen_bool(0.2) {
        None
    } else {
        Some(rng.gen_range(-3..=5))
    }
}

fn outer_column(rng: &mut StdRng) -> Operand {
    Operand::Outer(rng.gen_range(0..3), 0)
}

/// `x.<col> <op> o.<col>` (either way round), the outer side sometimes shifted by one.
fn comparison(rng: &mut StdRng, inner_columns: usize, ops: &[Op]) -> Cond {
    let inner = Operand::Inner(rng.gen_range(0..inner_columns));
    let shift = if rng.gen_range(0..5) == 0 {
        if rng.gen_bool(0.5) {
            1
        } else {
            -1
        }
    } else {
        0
    };
    let outer = Operand::Outer(rng.gen_range(0..3), shift);
    let op = ops[rng.gen_range(0..ops.len())];
    if rng.gen_range(0..4) == 0 {
        Cond::Cmp(outer, op, inner)
    } else {
        Cond::Cmp(inner, op, outer)
    }
}

/// A further conjunct: an equality, a BETWEEN of outer columns, or a literal bound.
fn extra(rng: &mut StdRng, inner_columns: usize) -> Cond {
    let v = Operand::Inner(rng.gen_range(0..inner_columns));
    match rng.gen_range(0..3) {
        0 => Cond::Cmp(v, Op::Eq, outer_column(rng)),
        1 => Cond::Between(v, outer_column(rng), outer_column(rng)),
        _ => Cond::Cmp(
            v,
            ANY_OP[rng.gen_range(0..ANY_OP.len())],
            Operand::Literal(rng.gen_range(-3..=5)),
        ),
    }
}

/// One or two comparisons (at least one not an equality) and maybe a further conjunct.
fn condition(rng: &mut StdRng, inner_columns: usize) -> Cond {
    let mut cond = comparison(rng, inner_columns, &NOT_EQUAL);
    if rng.gen_bool(0.5) {
        let other = comparison(rng, inner_columns, &ANY_OP);
        let (l, r) = if rng.gen_bool(0.5) {
            (cond, other)
        } else {
            (other, cond)
        };
        cond = if rng.gen_bool(0.5) {
            Cond::And(Box::new(l), Box::new(r))
        } else {
            Cond::Or(Box::new(l), Box::new(r))
        };
    }
    if rng.gen_bool(0.4) {
        let more = extra(rng, inner_columns);
        cond = if rng.gen_bool(0.5) {
            Cond::And(Box::new(cond), Box::new(more))
        } else {
            Cond::And(Box::new(more), Box::new(cond))
        };
    }
    cond
}

fn random_case(rng: &mut StdRng) -> Case {
    let stream = rng.gen_bool(0.4);
    let inner_columns = if stream { 2 } else { 3 };
    let col = rng.gen_range(0..inner_columns);
    let agg = match rng.gen_range(0..7) {
        0 => Agg::CountStar,
        1 => Agg::CountOne,
        2 => Agg::Count(col),
        3 => Agg::Sum(col),
        4 => Agg::Min(col),
        5 => Agg::Max(col),
        _ => Agg::CountStarPlusOne,
    };
    let cond = condition(rng, inner_columns);
    let filter = if rng.gen_range(0..3) == 0 {
        Some((
            ANY_OP[rng.gen_range(0..ANY_OP.len())],
            rng.gen_range(-3..=10),
        ))
    } else {
        None
    };
    Case {
        stream,
        agg,
        cond,
        filter,
    }
}

fn literal(v: Option<i64>) -> String {
    match v {
        Some(v) => v.to_string(),
        None => "NULL".into(),
    }
}

fn text(v: Option<i64>) -> Option<String> {
    v.map(|v| v.to_string())
}

/// Creates and fills `ct` and `cs`, checking that they read back as generated.
async fn load(client: &Client, rng: &mut StdRng) -> Data {
    exec(
        client,
        "CREATE TABLE ct (id int PRIMARY KEY, a int, b int, c int)",
    )
    .await;
    exec(client, "CREATE STREAM cs (a int, b int)").await;
    let ids: Vec<i64> = (1..=CT_ROWS).collect();
    let ct: Vec<Row> = ids
        .iter()
        .map(|_| [value(rng), value(rng), value(rng)])
        .collect();
    let cs: Vec<Row> = (0..CS_ROWS)
        .map(|_| [value(rng), value(rng), None])
        .collect();
    let tuples: Vec<String> = ids
        .iter()
        .zip(&ct)
        .map(|(id, r)| {
            let [a, b, c] = r.map(literal);
            format!("({id}, {a}, {b}, {c})")
        })
        .collect();
    exec(
        client,
        &format!("INSERT INTO ct VALUES {}", tuples.join(", ")),
    )
    .await;
    let tuples: Vec<String> = cs
        .iter()
        .map(|r| format!("({}, {})", literal(r[0]), literal(r[1])))
        .collect();
    exec(
        client,
        &format!("INSERT INTO cs (a, b) VALUES {}", tuples.join(", ")),
    )
    .await;
    let want: Rows = ids
        .iter()
        .zip(&ct)
        .map(|(id, r)| {
            let mut row = vec![Some(id.to_string())];
            row.extend(r.iter().map(|v| text(*v)));
            row
        })
        .collect();
    assert_eq!(
        simple_rows(client, "SELECT id, a, b, c FROM ct ORDER BY id").await,
        want,
        "ct does not read back as inserted"
    );
    let want: Rows = cs.iter().map(|r| vec![text(r[0]), text(r[1])]).collect();
    assert_eq!(
        simple_rows(client, "SELECT a, b FROM cs ORDER BY offset").await,
        want,
        "cs does not read back as inserted"
    );
    Data { ids, ct, cs }
}

/// The rows of the query's (last) result set, or its error.
async fn answer(client: &Client, sql: &str) -> Result<Rows, String> {
    try_simple_rows(client, sql).await.map_err(|e| {
        format!(
            "error {}: {}",
            sqlstate(&e).unwrap_or("-"),
            error_message(&e)
        )
    })
}

/// Rows on one line: values joined by `:`, rows by spaces.
fn show(rows: &Rows) -> String {
    rows.iter()
        .map(|row| {
            row.iter()
                .map(|v| v.as_deref().unwrap_or("NULL"))
                .collect::<Vec<_>>()
                .join(":")
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[tokio::test(flavor = "multi_thread")]
async fn non_equality_correlated_subqueries_match_brute_force() {
    let cases: usize = std::env::var("SLUICE_SUBQUERY_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(150);
    println!("seed {SEED}, {cases} cases");
    let server = Server::start().await;
    let client = server.client().await;
    let mut rng = StdRng::seed_from_u64(SEED);
    let data = load(&client, &mut rng).await;
    let mut failures = Vec::new();
    for i in 0..cases {
        let case = random_case(&mut rng);
        let sql = case.sql();
        let expected = case.expected(&data);
        let actual = answer(&client, &sql).await;
        if actual.as_ref() != Ok(&expected) {
            println!("case {i} differs: {sql}");
            let actual = match actual {
                Ok(rows) => show(&rows),
                Err(e) => e,
            };
            failures.push(format!(
                "case {i}: {sql}\n  expected: {}\n  actual:   {actual}",
                show(&expected)
            ));
        }
    }
    let shown = failures.len().min(SHOWN);
    assert!(
        failures.is_empty(),
        "{} of {cases} queries differ from brute force (seed {SEED}); the first {shown}:\n{}",
        failures.len(),
        failures[..shown].join("\n")
    );
}

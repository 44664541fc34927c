//! What the hostile clients saw, by class: every attempt is counted once, either as an
//! expected outcome (an SQLSTATE the case allows, a result, a close the protocol calls for)
//! or as an unexpected one (a lost connection that should have lived, `XX000`, a statement
//! that succeeded when it must not, no answer in time), of which a few examples are kept.
//!
//! Outcome keys are short strings: an SQLSTATE (`54001`), `ok`, or a word (`closed`).

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

/// Examples kept per class (the counts are complete).
pub const MAX_EXAMPLES: usize = 12;

/// The kinds of hostile client.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Class {
    /// Raw sockets sending random and mutated frontend messages, before and after startup.
    Fuzz,
    /// Statements nested thousands deep, and statements of megabytes.
    Deep,
    /// Queries that ask for more memory or time than a statement may have.
    Hungry,
    /// Long queries cancelled, timed out, or abandoned by a client that disconnects.
    Cancel,
    /// Sockets that never finish startup.
    Idle,
    /// A fresh login and `SELECT 1` every second: are other clients still served?
    Probe,
}

impl Class {
    pub const ALL: [Class; 6] = [
        Class::Fuzz,
        Class::Deep,
        Class::Hungry,
        Class::Cancel,
        Class::Idle,
        Class::Probe,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Class::Fuzz => "fuzzed messages",
            Class::Deep => "deep statements",
            Class::Hungry => "memory-hungry queries",
            Class::Cancel => "cancels and disconnects",
            Class::Idle => "never-finished startups",
            Class::Probe => "liveness probe",
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct ClassTally {
    pub attempts: u64,
    pub expected: BTreeMap<String, u64>,
    pub unexpected: BTreeMap<String, u64>,
    pub examples: Vec<String>,
}

impl ClassTally {
    pub fn unexpected_total(&self) -> u64 {
        self.unexpected.values().sum()
    }
}

/// The counts of every class, shared by the clients.
#[derive(Debug, Default)]
pub struct Tally(Mutex<BTreeMap<Class, ClassTally>>);

impl Tally {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<Class, ClassTally>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// One attempt of `class` ended as its case allows.
    pub fn expected(&self, class: Class, outcome: &str) {
        let mut all = self.lock();
        let t = all.entry(class).or_default();
        t.attempts += 1;
        *t.expected.entry(outcome.to_string()).or_default() += 1;
    }

    /// One attempt of `class` ended in a way it must not; `example` says what was sent.
    pub fn unexpected(&self, class: Class, outcome: &str, example: String) {
        eprintln!(
            "hostile UNEXPECTED ({}): {outcome}: {example}",
            class.name()
        );
        let mut all = self.lock();
        let t = all.entry(class).or_default();
        t.attempts += 1;
        *t.unexpected.entry(outcome.to_string()).or_default() += 1;
        if t.examples.len() < MAX_EXAMPLES {
            t.examples.push(format!("{outcome}: {example}"));
        }
    }

    pub fn snapshot(&self) -> BTreeMap<Class, ClassTally> {
        self.lock().clone()
    }
}

/// The outcome key of a failed statement: its SQLSTATE, `connection lost`, or the client's
/// error (shortened).
pub fn error_key(e: &tokio_postgres::Error) -> String {
    if let Some(code) = e.code() {
        return code.code().to_string();
    }
    if e.is_closed() {
        return "connection lost".into();
    }
    short(&e.to_string(), 80)
}

/// `text` cut to `max` characters, with `…` when cut.
pub fn short(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let mut s: String = text.chars().take(max).collect();
    s.push('…');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_attempt_counts_once_and_examples_are_bounded() {
        let t = Tally::default();
        t.expected(Class::Deep, "54001");
        t.expected(Class::Deep, "54001");
        for i in 0..20 {
            t.unexpected(Class::Deep, "XX000", format!("case {i}"));
        }
        let all = t.snapshot();
        let deep = &all[&Class::Deep];
        assert_eq!(deep.attempts, 22);
        assert_eq!(deep.expected["54001"], 2);
        assert_eq!(deep.unexpected_total(), 20);
        assert_eq!(deep.examples.len(), MAX_EXAMPLES);
        assert!(!all.contains_key(&Class::Fuzz));
    }

    #[test]
    fn short_cuts_long_text_only() {
        assert_eq!(short("abc", 3), "abc");
        assert_eq!(short("abcd", 3), "abc…");
    }
}

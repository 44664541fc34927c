//! The Postgres wire-protocol front end of Sluice: configuration, the
//! accept loop and admission of connections (limit, authentication timeout,
//! failed-login delays), TLS and SCRAM authentication, the connection loop, the pgwire handlers, and the
//! Arrow → PostgreSQL value encoding, and the Prometheus endpoint. A library so that the `sluice` binary
//! (`main.rs`) and the micro-benchmarks in `bench/` use the same code.

#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod accept;
pub mod admission;
pub mod auth;
pub mod auth_delay;
pub mod burst;
pub mod config;
pub mod connection;
pub mod copy_out;
pub mod encode;
pub mod errors;
pub mod handler;
pub mod held;
pub mod logging;
pub mod metrics;
pub mod panics;
pub mod params;
pub mod pipeline;
pub mod rules;
pub use sluice_sql::scram;
pub mod tls;
pub mod wire;

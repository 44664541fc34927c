//! The Postgres wire-protocol front end of Sluice: configuration, the
//! connection loop, the pgwire handlers, and the Arrow → PostgreSQL value
//! encoding. A library so that the `sluice` binary (`main.rs`) and the
//! micro-benchmarks in `bench/` use the same code.

#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod config;
pub mod connection;
pub mod copy_out;
pub mod encode;
pub mod handler;
pub mod params;
pub mod wire;

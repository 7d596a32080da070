//! The store test suite: every test runs against both engines, SQLite (a fresh file) and
//! PostgreSQL (a fresh database on the server of `LIZARD_TEST_POSTGRES_URL`), through
//! [`crate::store_tests!`], which instantiates each listed test once per engine.
//!
//! PostgreSQL needs a server where the URL's user may `CREATE DATABASE`
//! (`scripts/postgres.sh` starts one). Without `LIZARD_TEST_POSTGRES_URL` the PostgreSQL
//! instances print that they were skipped and pass, unless `LIZARD_REQUIRE_POSTGRES=1`
//! (`scripts/test.sh` sets both): then they fail.

mod access;
mod billing;
mod blob_content;
mod cluster;
mod engine;
mod idempotency;
mod replicas;
mod schema;
mod services;
mod snapshots;
mod templates;
mod tenancy;
mod volumes;

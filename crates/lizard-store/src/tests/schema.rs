//! Both engines' migrations make the same schema: the same tables and columns (of the
//! same kind, nullability and primary key), the same named indexes, unique constraints and
//! foreign keys. The migrations are written per dialect; this is what keeps them one.

use crate::harness::{Engine, TestDb, TestStore};
use std::collections::BTreeSet;

/// A column's type as both engines mean it.
fn kind(declared: &str) -> &'static str {
    match declared.to_ascii_lowercase().as_str() {
        "integer" | "bigint" => "integer",
        "text" => "text",
        "blob" | "bytea" => "bytes",
        "boolean" => "boolean",
        other => panic!("a column type neither engine's migrations should use: {other}"),
    }
}

/// The schema's facts, one line each, sorted.
async fn schema(store: &TestStore, engine: Engine) -> BTreeSet<String> {
    let queries: &[(&str, &str)] = match engine {
        Engine::Sqlite => &[
            (
                "column",
                "SELECT m.name, p.name, p.type, CASE WHEN p.\"notnull\" = 1 OR p.pk > 0 THEN 'not null' ELSE 'null' END, \
                 CAST(p.pk AS TEXT) FROM sqlite_master m JOIN pragma_table_info(m.name) p \
                 WHERE m.type = 'table' AND m.name NOT LIKE 'sqlite_%'",
            ),
            (
                "index",
                "SELECT m.tbl_name, m.name FROM sqlite_master m WHERE m.type = 'index' AND m.sql IS NOT NULL",
            ),
            (
                "unique",
                "SELECT m.name, (SELECT group_concat(name, ',') FROM \
                   (SELECT ii.name FROM pragma_index_info(il.name) ii ORDER BY ii.seqno)) \
                 FROM sqlite_master m JOIN pragma_index_list(m.name) il \
                 WHERE m.type = 'table' AND m.name NOT LIKE 'sqlite_%' AND il.origin = 'u'",
            ),
            (
                "foreign key",
                "SELECT m.name, f.\"from\", f.\"table\", f.\"to\", f.on_delete FROM sqlite_master m \
                 JOIN pragma_foreign_key_list(m.name) f WHERE m.type = 'table'",
            ),
        ],
        Engine::Postgres => &[
            (
                "column",
                "SELECT c.table_name::text, c.column_name::text, c.data_type::text, \
                   CASE WHEN c.is_nullable = 'NO' THEN 'not null' ELSE 'null' END, \
                   COALESCE((SELECT k.ordinal_position::text FROM information_schema.table_constraints t \
                     JOIN information_schema.key_column_usage k ON k.constraint_name = t.constraint_name \
                       AND k.table_name = t.table_name \
                     WHERE t.constraint_type = 'PRIMARY KEY' AND t.table_schema = 'public' \
                       AND t.table_name = c.table_name AND k.column_name = c.column_name), '0') \
                 FROM information_schema.columns c WHERE c.table_schema = 'public'",
            ),
            (
                "index",
                "SELECT tablename::text, indexname::text FROM pg_indexes WHERE schemaname = 'public' \
                 AND indexname NOT IN (SELECT conname FROM pg_constraint)",
            ),
            (
                "unique",
                "SELECT c.conrelid::regclass::text, (SELECT string_agg(a.attname, ',' ORDER BY k.ord) \
                   FROM unnest(c.conkey) WITH ORDINALITY k(attnum, ord) \
                   JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.attnum) \
                 FROM pg_constraint c WHERE c.contype = 'u' AND c.connamespace = 'public'::regnamespace",
            ),
            (
                "foreign key",
                "SELECT c.conrelid::regclass::text, a.attname::text, c.confrelid::regclass::text, af.attname::text, \
                   CASE c.confdeltype WHEN 'c' THEN 'CASCADE' WHEN 'n' THEN 'SET NULL' WHEN 'r' THEN 'RESTRICT' \
                     WHEN 'd' THEN 'SET DEFAULT' ELSE 'NO ACTION' END \
                 FROM pg_constraint c CROSS JOIN LATERAL unnest(c.conkey, c.confkey) AS k(attnum, fattnum) \
                 JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.attnum \
                 JOIN pg_attribute af ON af.attrelid = c.confrelid AND af.attnum = k.fattnum \
                 WHERE c.contype = 'f' AND c.connamespace = 'public'::regnamespace",
            ),
        ],
    };
    let mut facts = BTreeSet::new();
    for (what, sql) in queries {
        for mut row in store.text_rows(sql).await {
            if *what == "column" {
                row[2] = kind(&row[2]).to_owned();
            }
            facts.insert(format!("{what}: {}", row.join(" ")));
        }
    }
    facts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_engines_migrate_to_the_same_schema() {
    let sqlite = TestDb::new(Engine::Sqlite).await.unwrap();
    let Some(postgres) = TestDb::new(Engine::Postgres).await else { return };
    assert_eq!(sqlite.known_version(), postgres.known_version(), "both engines have every migration");
    let on_sqlite = schema(&sqlite.open().await, Engine::Sqlite).await;
    let on_postgres = schema(&postgres.open().await, Engine::Postgres).await;
    postgres.drop_database().await;
    assert!(on_sqlite.iter().any(|f| f.starts_with("column: sandboxes id text not null 1")), "{on_sqlite:#?}");
    for what in ["column", "index", "unique", "foreign key"] {
        assert!(on_postgres.iter().any(|f| f.starts_with(&format!("{what}: "))), "no {what} read: {on_postgres:#?}");
    }
    let only_sqlite: Vec<_> = on_sqlite.difference(&on_postgres).collect();
    let only_postgres: Vec<_> = on_postgres.difference(&on_sqlite).collect();
    assert!(
        only_sqlite.is_empty() && only_postgres.is_empty(),
        "SQLite's schema only: {only_sqlite:#?}\nPostgreSQL's only: {only_postgres:#?}"
    );
}

//! [`ClusterStore`] on either engine.
//!
//! **Replicas.** A lease is taken by one conditional UPDATE: PostgreSQL makes a second
//! contender wait on the row and re-check its WHERE against the first one's commit, so two
//! replicas never both see it theirs (`store::tests::cluster` races them). Heartbeats and
//! the expiry of lost nodes are write transactions ([`super::SqlStore::write`]), as every
//! billing step is.

use super::{backend, billing, col, conflict_or_backend, json_err, sandbox, Engine, SqlStore, SANDBOX_COLUMNS};
use crate::cluster::*;
use crate::{MeterState, Result, StoreError};
use async_trait::async_trait;
use sqlx::any::AnyRow;
use sqlx::{Any, Transaction};

const NODE_COLUMNS: &str = "id, region, address, state, vcpus, memory_mib, disk_gib, used_vcpus, used_memory_mib, \
     sandboxes, templates, last_heartbeat, created_at";

const TOKEN_COLUMNS: &str = "id, hash, created_at, expires_at, revoked_at, uses_left";

fn int<T: TryFrom<i64>>(r: &AnyRow, column: &str) -> Result<T>
where
    T::Error: std::error::Error + Send + Sync + 'static,
{
    let v: i64 = col(r, column)?;
    T::try_from(v).map_err(|e| StoreError::Backend(Box::new(e)))
}

fn stored(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn node(r: &AnyRow) -> Result<ClusterNode> {
    let templates: String = col(r, "templates")?;
    let report = NodeReport {
        capacity: lizard_api::cluster::NodeCapacity {
            vcpus: int(r, "vcpus")?,
            memory_mib: int(r, "memory_mib")?,
            disk_gib: int(r, "disk_gib")?,
        },
        usage: lizard_api::cluster::NodeUsage {
            vcpus: int(r, "used_vcpus")?,
            memory_mib: int(r, "used_memory_mib")?,
            sandboxes: int(r, "sandboxes")?,
        },
        templates: serde_json::from_str(&templates).map_err(json_err)?,
        sandboxes: Vec::new(),
    };
    Ok(ClusterNode {
        id: col(r, "id")?,
        region: col(r, "region")?,
        address: col(r, "address")?,
        state: parse_node_state(&col::<String, _>(r, "state")?)?,
        report,
        last_heartbeat: col(r, "last_heartbeat")?,
        created_at: col(r, "created_at")?,
    })
}

fn token(r: &AnyRow) -> Result<NodeTokenRecord> {
    Ok(NodeTokenRecord {
        id: col(r, "id")?,
        hash: col(r, "hash")?,
        created_at: col(r, "created_at")?,
        expires_at: col(r, "expires_at")?,
        revoked_at: col(r, "revoked_at")?,
        uses_left: col(r, "uses_left")?,
    })
}

/// End a live sandbox's record at `at` with `reason`, detach its volume and close its
/// meter there (inside the caller's transaction).
async fn end_tx(tx: &mut Transaction<'static, Any>, sandbox_id: &str, at: i64, reason: &str) -> Result<()> {
    sqlx::query(
        "UPDATE sandboxes SET ended_at = $1, end_reason = $2, state = 'ended' WHERE id = $3 AND ended_at IS NULL",
    )
    .bind(at)
    .bind(reason)
    .bind(sandbox_id)
    .execute(&mut **tx)
    .await
    .map_err(backend)?;
    sqlx::query("UPDATE volumes SET attached_to = NULL WHERE attached_to = $1")
        .bind(sandbox_id)
        .execute(&mut **tx)
        .await
        .map_err(backend)?;
    billing::transition_tx(tx, sandbox_id, MeterState::Ended, at).await
}

impl SqlStore {
    async fn node_or_not_found(&self, node_id: &str) -> Result<ClusterNode> {
        self.get_node(node_id).await?.ok_or_else(|| StoreError::NotFound(format!("node {node_id}")))
    }
}

#[async_trait]
impl ClusterStore for SqlStore {
    async fn cluster_key(&self, candidate: &[u8]) -> Result<Vec<u8>> {
        sqlx::query("INSERT INTO cluster_keys (id, key) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING")
            .bind(CLUSTER_KEY_ID)
            .bind(candidate)
            .execute(&self.pool)
            .await
            .map_err(backend)?;
        sqlx::query_scalar("SELECT key FROM cluster_keys WHERE id = $1")
            .bind(CLUSTER_KEY_ID)
            .fetch_one(&self.pool)
            .await
            .map_err(backend)
    }

    async fn insert_node_token(&self, t: &NodeTokenRecord) -> Result<()> {
        sqlx::query(&format!("INSERT INTO node_tokens ({TOKEN_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6)"))
            .bind(&t.id)
            .bind(&t.hash)
            .bind(t.created_at)
            .bind(t.expires_at)
            .bind(t.revoked_at)
            .bind(t.uses_left)
            .execute(&self.pool)
            .await
            .map_err(|e| conflict_or_backend(e, || format!("node token {} already exists", t.id)))?;
        Ok(())
    }

    async fn node_token_by_hash(&self, hash: &[u8]) -> Result<Option<NodeTokenRecord>> {
        sqlx::query(&format!("SELECT {TOKEN_COLUMNS} FROM node_tokens WHERE hash = $1"))
            .bind(hash)
            .fetch_optional(&self.pool)
            .await
            .map_err(backend)?
            .as_ref()
            .map(token)
            .transpose()
    }

    async fn use_node_token(&self, hash: &[u8], now: i64) -> Result<Option<NodeTokenRecord>> {
        sqlx::query(&format!(
            "UPDATE node_tokens SET uses_left = uses_left - 1 \
             WHERE hash = $1 AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > $2) \
             AND (uses_left IS NULL OR uses_left > 0) RETURNING {TOKEN_COLUMNS}"
        ))
        .bind(hash)
        .bind(now)
        .fetch_optional(&self.pool)
        .await
        .map_err(backend)?
        .as_ref()
        .map(token)
        .transpose()
    }

    async fn list_node_tokens(&self, now: i64) -> Result<Vec<NodeTokenRecord>> {
        sqlx::query(&format!(
            "SELECT {TOKEN_COLUMNS} FROM node_tokens WHERE revoked_at IS NULL AND (expires_at IS NULL OR expires_at > $1) \
             AND (uses_left IS NULL OR uses_left > 0) ORDER BY created_at, id"
        ))
        .bind(now)
        .fetch_all(&self.pool)
        .await
        .map_err(backend)?
        .iter()
        .map(token)
        .collect()
    }

    async fn revoke_node_token(&self, token_id: &str, at: i64) -> Result<()> {
        let r = sqlx::query("UPDATE node_tokens SET revoked_at = $1 WHERE id = $2 AND revoked_at IS NULL")
            .bind(at)
            .bind(token_id)
            .execute(&self.pool)
            .await
            .map_err(backend)?;
        if r.rows_affected() == 0 {
            return Err(StoreError::NotFound(format!("node token {token_id}")));
        }
        Ok(())
    }

    async fn owner_account_id(&self) -> Result<Option<String>> {
        sqlx::query_scalar("SELECT id FROM accounts ORDER BY created_at, id LIMIT 1")
            .fetch_optional(&self.pool)
            .await
            .map_err(backend)
    }

    async fn insert_node(&self, n: &NewNode) -> Result<()> {
        let templates = serde_json::to_string(&n.report.templates).map_err(json_err)?;
        let (cap, used) = (&n.report.capacity, &n.report.usage);
        sqlx::query(&format!(
            "INSERT INTO nodes ({NODE_COLUMNS}) VALUES ($1, $2, $3, 'up', $4, $5, $6, $7, $8, $9, $10, $11, $12)"
        ))
        .bind(&n.id)
        .bind(&n.region)
        .bind(&n.address)
        .bind(i64::from(cap.vcpus))
        .bind(stored(cap.memory_mib))
        .bind(stored(cap.disk_gib))
        .bind(i64::from(used.vcpus))
        .bind(stored(used.memory_mib))
        .bind(i64::from(used.sandboxes))
        .bind(templates)
        .bind(n.at)
        .bind(n.at)
        .execute(&self.pool)
        .await
        .map_err(|e| conflict_or_backend(e, || format!("node {} already exists", n.id)))?;
        Ok(())
    }

    async fn get_node(&self, node_id: &str) -> Result<Option<ClusterNode>> {
        sqlx::query(&format!("SELECT {NODE_COLUMNS} FROM nodes WHERE id = $1"))
            .bind(node_id)
            .fetch_optional(&self.pool)
            .await
            .map_err(backend)?
            .as_ref()
            .map(node)
            .transpose()
    }

    async fn remove_node(&self, node_id: &str) -> Result<()> {
        let mut tx = self.write().await?;
        let address: Option<Option<String>> = sqlx::query_scalar("SELECT address FROM nodes WHERE id = $1")
            .bind(node_id)
            .fetch_optional(&mut *tx)
            .await
            .map_err(backend)?;
        match address {
            None => return Err(StoreError::NotFound(format!("node {node_id}"))),
            Some(None) => return Err(StoreError::Conflict(format!("node {node_id} runs inside the server process"))),
            Some(Some(_)) => {}
        }
        let sandboxes: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM sandboxes WHERE node_id = $1 AND ended_at IS NULL")
                .bind(node_id)
                .fetch_one(&mut *tx)
                .await
                .map_err(backend)?;
        let volumes: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM volumes WHERE node_id = $1")
            .bind(node_id)
            .fetch_one(&mut *tx)
            .await
            .map_err(backend)?;
        if sandboxes > 0 || volumes > 0 {
            return Err(StoreError::Conflict(format!(
                "node {node_id} holds {sandboxes} sandbox(es) and {volumes} volume(s): drain it, and end or move them first"
            )));
        }
        for table in ["node_unrecorded WHERE node_id", "nodes WHERE id"] {
            sqlx::query(&format!("DELETE FROM {table} = $1")).bind(node_id).execute(&mut *tx).await.map_err(backend)?;
        }
        tx.commit().await.map_err(backend)
    }

    async fn list_nodes(&self) -> Result<Vec<ClusterNode>> {
        sqlx::query(&format!("SELECT {NODE_COLUMNS} FROM nodes ORDER BY created_at, id"))
            .fetch_all(&self.pool)
            .await
            .map_err(backend)?
            .iter()
            .map(node)
            .collect()
    }

    async fn placed_since_heartbeat(&self) -> Result<std::collections::BTreeMap<String, u32>> {
        let rows: Vec<(String, i64)> = sqlx::query_as(
            "SELECT s.node_id, COUNT(*) FROM sandboxes s JOIN nodes n ON n.id = s.node_id \
             WHERE s.ended_at IS NULL AND s.state = 'running' AND n.last_heartbeat IS NOT NULL \
             AND s.created_at > n.last_heartbeat GROUP BY s.node_id",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(backend)?;
        Ok(rows.into_iter().map(|(node, n)| (node, u32::try_from(n).unwrap_or(u32::MAX))).collect())
    }

    async fn record_heartbeat(
        &self,
        node_id: &str,
        report: &NodeReport,
        at: i64,
        grace_ms: i64,
    ) -> Result<HeartbeatOutcome> {
        let templates = serde_json::to_string(&report.templates).map_err(json_err)?;
        let (cap, used) = (&report.capacity, &report.usage);
        let mut tx = self.write().await?;
        let state: Option<String> = sqlx::query_scalar(
            "UPDATE nodes SET vcpus = $1, memory_mib = $2, disk_gib = $3, used_vcpus = $4, used_memory_mib = $5, \
             sandboxes = $6, templates = $7, last_heartbeat = $8, \
             state = CASE WHEN state = 'down' THEN 'up' ELSE state END WHERE id = $9 RETURNING state",
        )
        .bind(i64::from(cap.vcpus))
        .bind(stored(cap.memory_mib))
        .bind(stored(cap.disk_gib))
        .bind(i64::from(used.vcpus))
        .bind(stored(used.memory_mib))
        .bind(i64::from(used.sandboxes))
        .bind(templates)
        .bind(at)
        .bind(node_id)
        .fetch_optional(&mut *tx)
        .await
        .map_err(backend)?;
        let state = parse_node_state(&state.ok_or_else(|| StoreError::NotFound(format!("node {node_id}")))?)?;
        let reported: Vec<&str> = report.sandboxes.iter().map(|s| s.sandbox_id.as_str()).collect();
        let reported_list = super::json_list(&reported)?;
        // Sightings of sandboxes it no longer reports are forgotten; new unknown ones
        // start their grace period now.
        sqlx::query(&format!(
            "DELETE FROM node_unrecorded WHERE node_id = $1 AND sandbox_id NOT IN {}",
            self.engine.json_list("$2")
        ))
        .bind(node_id)
        .bind(&reported_list)
        .execute(&mut *tx)
        .await
        .map_err(backend)?;
        let mut stop = Vec::new();
        for &id in &reported {
            let ended: Option<Option<i64>> = sqlx::query_scalar("SELECT ended_at FROM sandboxes WHERE id = $1")
                .bind(id)
                .fetch_optional(&mut *tx)
                .await
                .map_err(backend)?;
            match ended {
                Some(Some(_)) => stop.push(id.to_owned()),
                Some(None) => {
                    sqlx::query("DELETE FROM node_unrecorded WHERE node_id = $1 AND sandbox_id = $2")
                        .bind(node_id)
                        .bind(id)
                        .execute(&mut *tx)
                        .await
                        .map_err(backend)?;
                }
                None => {
                    let first_seen: i64 = sqlx::query_scalar(
                        "INSERT INTO node_unrecorded (node_id, sandbox_id, first_seen) VALUES ($1, $2, $3) \
                         ON CONFLICT (node_id, sandbox_id) DO UPDATE SET first_seen = node_unrecorded.first_seen \
                         RETURNING first_seen",
                    )
                    .bind(node_id)
                    .bind(id)
                    .bind(at)
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(backend)?;
                    if at.saturating_sub(first_seen) >= grace_ms {
                        stop.push(id.to_owned());
                    }
                }
            }
        }
        // Records it no longer holds (a node restart lost them), past the grace period —
        // unless its list is shorter than its own count (a partial report ends nothing).
        let mut ended: Vec<String> = Vec::new();
        if u64::from(report.usage.sandboxes) <= u64::try_from(report.sandboxes.len()).unwrap_or(u64::MAX) {
            ended = sqlx::query_scalar(&format!(
                "SELECT id FROM sandboxes WHERE node_id = $1 AND ended_at IS NULL AND created_at <= $2 \
                 AND id NOT IN {} ORDER BY id",
                self.engine.json_list("$3")
            ))
            .bind(node_id)
            .bind(at.saturating_sub(grace_ms))
            .bind(&reported_list)
            .fetch_all(&mut *tx)
            .await
            .map_err(backend)?;
            for id in &ended {
                end_tx(&mut tx, id, at, GONE_REASON).await?;
            }
        }
        tx.commit().await.map_err(backend)?;
        Ok(HeartbeatOutcome { state, stop, ended })
    }

    async fn add_node_template(&self, node_id: &str, template: &str) -> Result<()> {
        // `templates` is a JSON array of names as text: append unless there.
        let sql = match self.engine {
            Engine::Sqlite => {
                "UPDATE nodes SET templates = json_insert(templates, '$[#]', $1) \
                 WHERE id = $2 AND NOT EXISTS (SELECT 1 FROM json_each(nodes.templates) WHERE value = $1)"
            }
            Engine::Postgres => {
                "UPDATE nodes SET templates = (templates::jsonb || to_jsonb($1::text))::text \
                 WHERE id = $2 AND NOT (templates::jsonb ? $1)"
            }
        };
        sqlx::query(sql).bind(template).bind(node_id).execute(&self.pool).await.map_err(backend)?;
        Ok(())
    }

    async fn set_node_draining(&self, node_id: &str, draining: bool) -> Result<ClusterNode> {
        let node = self.node_or_not_found(node_id).await?;
        match (node.state, draining) {
            (NodeState::Down, true) => return Ok(node),
            (NodeState::Down, false) => return Err(StoreError::Conflict(format!("node {node_id} is down"))),
            _ => {}
        }
        let (to, from) = if draining { ("draining", "up") } else { ("up", "draining") };
        sqlx::query("UPDATE nodes SET state = $1 WHERE id = $2 AND state = $3")
            .bind(to)
            .bind(node_id)
            .bind(from)
            .execute(&self.pool)
            .await
            .map_err(backend)?;
        self.node_or_not_found(node_id).await
    }

    async fn expire_nodes(&self, now: i64, lease_ms: i64, reason: &str) -> Result<Vec<LostNode>> {
        let cutoff = now.saturating_sub(lease_ms);
        let stale: Vec<String> = sqlx::query_scalar(
            "SELECT id FROM nodes WHERE address IS NOT NULL AND state IN ('up', 'draining') \
             AND last_heartbeat < $1 ORDER BY id",
        )
        .bind(cutoff)
        .fetch_all(&self.pool)
        .await
        .map_err(backend)?;
        let mut lost = Vec::with_capacity(stale.len());
        for node_id in stale {
            let mut tx = self.write().await?;
            // Still stale inside the write lock: a heartbeat that landed meanwhile wins.
            let last: Option<i64> = sqlx::query_scalar(
                "UPDATE nodes SET state = 'down' WHERE id = $1 AND state IN ('up', 'draining') \
                 AND last_heartbeat < $2 RETURNING last_heartbeat",
            )
            .bind(&node_id)
            .bind(cutoff)
            .fetch_optional(&mut *tx)
            .await
            .map_err(backend)?;
            let Some(last_heartbeat) = last else { continue };
            let sandboxes = sqlx::query(&format!(
                "SELECT {SANDBOX_COLUMNS} WHERE s.node_id = $1 AND s.ended_at IS NULL AND s.state = 'running' ORDER BY s.created_at, s.id"
            ))
            .bind(&node_id)
            .fetch_all(&mut *tx)
            .await
            .map_err(backend)?
            .iter()
            .map(sandbox)
            .collect::<Result<Vec<_>>>()?;
            for s in &sandboxes {
                end_tx(&mut tx, &s.id, last_heartbeat, reason).await?;
            }
            tx.commit().await.map_err(backend)?;
            lost.push(LostNode { node_id, last_heartbeat, sandboxes });
        }
        Ok(lost)
    }

    async fn acquire_lease(&self, name: &str, holder: &str, now: i64, ttl_ms: i64) -> Result<bool> {
        let until = now.saturating_add(ttl_ms);
        // Insert-if-absent, then take it over only if it is ours or lapsed: one statement
        // each, so two contenders never both see it theirs.
        sqlx::query("INSERT INTO leases (name, holder, expires_at) VALUES ($1, $2, $3) ON CONFLICT (name) DO NOTHING")
            .bind(name)
            .bind(holder)
            .bind(until)
            .execute(&self.pool)
            .await
            .map_err(backend)?;
        let taken = sqlx::query(
            "UPDATE leases SET holder = $1, expires_at = $2 WHERE name = $3 AND (holder = $4 OR expires_at < $5)",
        )
        .bind(holder)
        .bind(until)
        .bind(name)
        .bind(holder)
        .bind(now)
        .execute(&self.pool)
        .await
        .map_err(backend)?;
        Ok(taken.rows_affected() == 1)
    }

    async fn release_lease(&self, name: &str, holder: &str) -> Result<()> {
        sqlx::query("DELETE FROM leases WHERE name = $1 AND holder = $2")
            .bind(name)
            .bind(holder)
            .execute(&self.pool)
            .await
            .map_err(backend)?;
        Ok(())
    }
}

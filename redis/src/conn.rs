//! One Redis node (a multiplexed connection manager that reconnects) or a Redis Cluster
//! (slot-routed, following MOVED and ASK), behind one `ConnectionLike`.

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};
use std::time::Duration;

/// A connection to one node or a cluster. Cheap to clone (clones share the connection).
#[derive(Clone)]
pub enum Conn {
    /// One node.
    Single(ConnectionManager),
    /// A Redis Cluster.
    Cluster(ClusterConnection),
}

impl Conn {
    /// Connects to one node at `url` (`redis://127.0.0.1:6379`). Connection attempts give up
    /// after `connect_timeout`; a lost connection is re-established in the background.
    pub async fn single(url: &str, connect_timeout: Duration) -> redis::RedisResult<Self> {
        Ok(Conn::Single(manager(url, connect_timeout).await?))
    }

    /// Connects to a cluster through any of its nodes' URLs.
    pub async fn cluster(urls: &[&str], connect_timeout: Duration) -> redis::RedisResult<Self> {
        let client = ClusterClientBuilder::new(urls.iter().copied())
            .connection_timeout(connect_timeout)
            .build()?;
        Ok(Conn::Cluster(client.get_async_connection().await?))
    }

    /// Whether this is a cluster connection.
    pub fn is_cluster(&self) -> bool {
        matches!(self, Conn::Cluster(_))
    }
}

/// A connection manager to one node whose attempts give up after `connect_timeout` (one retry,
/// then an error: an unreachable server is reported, not waited for). No response timeout of
/// its own: the store's per-call timeout bounds each call (and the tools' long pipelines are
/// not cut short).
pub(crate) async fn manager(
    url: &str,
    connect_timeout: Duration,
) -> redis::RedisResult<ConnectionManager> {
    let client = redis::Client::open(url)?;
    let cfg = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(connect_timeout))
        .set_response_timeout(None)
        .set_number_of_retries(1)
        .set_max_delay(Duration::from_millis(100));
    ConnectionManager::new_with_config(client, cfg).await
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

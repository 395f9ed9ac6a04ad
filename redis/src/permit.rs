//! Concurrency permits in Redis: [`RedisStore::acquire_owned`] and [`RedisPermit`], the async
//! counterpart of `turnstile::keyed::Store::acquire_owned` and `StorePermit`.
//!
//! A permit names its lease by the stamp the script chose (its expiry, unique within the key),
//! so a release frees exactly its own cells, and releasing a lease that expired (and was
//! perhaps handed out again) frees nothing. Dropping a permit cannot await: `Drop` spawns the
//! release on the current tokio runtime (if there is none, the lease expires on its own, as an
//! in-memory permit that is leaked does). [`RedisPermit::release`] awaits it and answers
//! whether Redis saw it.

use crate::error::Error;
use crate::reply;
use crate::store::RedisStore;
use std::sync::Arc;
use turnstile::keyed::StorePermit;
use turnstile::Decision;

/// In-flight capacity of one key of a [`RedisStore`], held until released or dropped (or
/// until its lease expires, if neither happens).
#[must_use = "the permit is released as soon as it is dropped"]
pub struct RedisPermit {
    store: Arc<RedisStore>,
    key: String,
    /// The lease's stamp (ns, decimal); `None` for a permit that releases nothing in Redis.
    stamp: Option<String>,
    /// The insurance store's permit, when the failure policy granted it.
    local: Option<StorePermit>,
    decision: Decision,
}

impl RedisPermit {
    /// The decision that granted it.
    pub fn decision(&self) -> &Decision {
        &self.decision
    }

    /// The lease's stamp in Redis (its expiry, ns since the Unix epoch as the server's clock
    /// counts), if it holds one there.
    pub fn stamp(&self) -> Option<&str> {
        self.stamp.as_deref()
    }

    /// Releases the permit now, at the server's time; answers the lease cells freed (0 if it
    /// had expired, or holds nothing in Redis).
    pub async fn release(mut self) -> Result<u64, Error> {
        self.local.take();
        match self.stamp.take() {
            Some(st) => self.store.release_stamp(&self.key, &st, None).await,
            None => Ok(0),
        }
    }

    /// [`RedisPermit::release`] at an explicit `now` (tests that run one trace through Redis
    /// and memory).
    pub async fn release_at(mut self, now: u64) -> Result<u64, Error> {
        self.local.take();
        match self.stamp.take() {
            Some(st) => self.store.release_stamp(&self.key, &st, Some(now)).await,
            None => Ok(0),
        }
    }
}

impl Drop for RedisPermit {
    fn drop(&mut self) {
        let Some(stamp) = self.stamp.take() else {
            return;
        };
        // Dropped without `release`: release in the background if a runtime is there; else
        // the lease expires by itself.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let store = Arc::clone(&self.store);
            let key = std::mem::take(&mut self.key);
            rt.spawn(async move {
                let _ = store.release_stamp(&key, &stamp, None).await;
            });
        }
    }
}

impl std::fmt::Debug for RedisPermit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisPermit")
            .field("key", &self.key)
            .field("stamp", &self.stamp)
            .field("decision", &self.decision)
            .finish()
    }
}

impl RedisStore {
    fn permit(self: &Arc<Self>, key: &str, stamp: Option<String>, d: Decision) -> RedisPermit {
        RedisPermit {
            store: Arc::clone(self),
            key: key.to_owned(),
            stamp,
            local: None,
            decision: d,
        }
    }

    async fn acquire_call(
        self: &Arc<Self>,
        key: &str,
        cost: u64,
        now: Option<u64>,
    ) -> Result<(Decision, Option<String>), Error> {
        let mode = if self.is_concurrency() { 'a' } else { 'c' };
        let v = self.call(&self.invocation(key, now, mode, cost)).await?;
        reply::store(&v)
    }

    /// For a concurrency limit: takes `cost` of `key`'s in-flight permits in Redis, held until
    /// the returned [`RedisPermit`] is released or dropped (or its lease expires). For any
    /// other limit this answers as [`RedisStore::try_check`] and the permit releases nothing
    /// (as `turnstile::keyed::Store::acquire_owned`). No failure policy: an error is returned.
    pub async fn try_acquire_owned(
        self: &Arc<Self>,
        key: &str,
        cost: u64,
    ) -> Result<Result<RedisPermit, Decision>, Error> {
        self.permit_call(key, cost, None).await
    }

    /// [`RedisStore::try_acquire_owned`] at an explicit `now` (release it with
    /// [`RedisPermit::release_at`]).
    pub async fn acquire_owned_at(
        self: &Arc<Self>,
        key: &str,
        cost: u64,
        now: u64,
    ) -> Result<Result<RedisPermit, Decision>, Error> {
        self.permit_call(key, cost, Some(now)).await
    }

    /// One acquire call, no failure policy: a permit if admitted, else the refusal.
    async fn permit_call(
        self: &Arc<Self>,
        key: &str,
        cost: u64,
        now: Option<u64>,
    ) -> Result<Result<RedisPermit, Decision>, Error> {
        let (d, stamp) = self.acquire_call(key, cost, now).await?;
        Ok(if d.allowed() {
            Ok(self.permit(key, stamp, d))
        } else {
            Err(d)
        })
    }

    /// [`RedisStore::try_acquire_owned`] with the failure policy: never fails. When Redis does
    /// not answer, `Open` grants a permit that holds nothing, `Closed` refuses, and
    /// `Insurance` takes a permit of the in-memory store (limit ÷ nodes), released with this
    /// one.
    pub async fn acquire_owned(
        self: &Arc<Self>,
        key: &str,
        cost: u64,
    ) -> Result<RedisPermit, Decision> {
        if !self.gate.admit(1) {
            return self.acquire_fallback(key, cost);
        }
        match self.acquire_call(key, cost, None).await {
            Ok((d, stamp)) => {
                self.answered(key, cost, &d);
                if d.allowed() {
                    Ok(self.permit(key, stamp, d))
                } else {
                    Err(d)
                }
            }
            Err(e) => {
                self.gate.failed(&e);
                self.acquire_fallback(key, cost)
            }
        }
    }

    fn acquire_fallback(self: &Arc<Self>, key: &str, cost: u64) -> Result<RedisPermit, Decision> {
        match &self.insurance {
            Some(local) if self.is_concurrency() => {
                self.gate.fell_back(1);
                let p = local.acquire_owned(key, cost)?;
                let mut permit = self.permit(key, None, *p.decision());
                permit.local = Some(p);
                Ok(permit)
            }
            _ => {
                let d = self.fallback(key, cost);
                if d.allowed() {
                    Ok(self.permit(key, None, d))
                } else {
                    Err(d)
                }
            }
        }
    }

    /// Frees the lease `stamp` of `key`; answers the cells freed.
    async fn release_stamp(&self, key: &str, stamp: &str, now: Option<u64>) -> Result<u64, Error> {
        let v = self.call(&self.invocation(key, now, 'x', stamp)).await?;
        reply::integer(&v)
    }
}

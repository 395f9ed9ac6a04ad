//! Limits classes whose entries are in Redis (`redis = "redis://..."` in `[limits.NAME]`):
//! each gets a turnstile-redis `RedisLimits` (a bounded cache in front of the Redis the fleet
//! shares, invalidated by Redis on every change) as its source when the engine is built.
//! Connected before anything listens; a Redis that cannot be reached then leaves the class
//! *loading* ([`Deferred`]): the server starts, not ready ([`Loading`]), its keys answer the
//! rule's defaults (as keys not cached yet do), and a thread connects again in the background
//! (after [`FIRST_RETRY`], the wait doubling to at most [`MAX_RETRY`]) until Redis answers. A
//! reload keeps each class's source (its plans updated); a class put in Redis, or moved to
//! another Redis, by a reload takes effect at the next start.

use arc_swap::ArcSwapOption;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use turnstile::rules::limits::{KeyLimit, LimitsClass, LimitsError, LimitsSource, Lookup};
use turnstile::rules::Rules;
use turnstile_redis::{RedisLimits, RedisLimitsStats};

/// The first wait before a class not loaded connects again.
const FIRST_RETRY: Duration = Duration::from_millis(250);
/// The longest wait between two attempts.
const MAX_RETRY: Duration = Duration::from_secs(5);

/// The sources this process connected, by class, for the metrics (dropped ones skipped).
static CONNECTED: Mutex<Vec<(String, Weak<RedisLimits>)>> = Mutex::new(Vec::new());

/// The counters of each class in Redis still in use.
pub(crate) fn stats() -> Vec<(String, RedisLimitsStats)> {
    let mut c = CONNECTED.lock().unwrap_or_else(|e| e.into_inner());
    c.retain(|(_, w)| w.strong_count() > 0);
    c.iter()
        .filter_map(|(n, w)| Some((n.clone(), w.upgrade()?.stats())))
        .collect()
}

/// The classes of a server whose source was not connected at the start, for readiness.
#[derive(Default)]
pub(crate) struct Loading(Vec<Arc<Deferred>>);

impl Loading {
    /// Why the classes still loading are not loaded (one clause each), if any is.
    pub(crate) fn why(&self) -> Option<String> {
        let why: Vec<String> = self
            .0
            .iter()
            .filter(|d| d.source.load().is_none())
            .map(|d| {
                let e = d.error.lock().unwrap_or_else(|e| e.into_inner()).clone();
                format!("limits class `{}` not loaded from Redis yet: {e}", d.name)
            })
            .collect();
        (!why.is_empty()).then(|| why.join("; "))
    }
}

/// A class's name and its source.
pub(crate) type Source = (String, Arc<dyn LimitsSource>);

/// A source for every class of `rules` in Redis, by class name: connected, or loading in the
/// background when Redis does not answer (those also in [`Loading`]).
pub(crate) fn sources(rules: &Rules, origin: &str) -> Result<(Vec<Source>, Loading), String> {
    let mut out = Vec::new();
    let mut loading = Loading::default();
    for c in &rules.classes {
        let Some(url) = &c.redis else { continue };
        // What the class gets wrong refuses the start; only a Redis that does not answer
        // leaves it loading.
        RedisLimits::builder(c)
            .check(url)
            .map_err(|e| format!("{origin}: limits class `{}`: {e}", c.name))?;
        let src: Arc<dyn LimitsSource> = match connect(c, url) {
            Ok(src) => src,
            Err(e) => {
                let e = format!(
                    "{origin}: limits class `{}`: {e}; check that Redis is up and reachable",
                    c.name
                );
                tracing::warn!(class = %c.name, error = %e, "limits class in Redis not loaded: starting not ready, its keys on the rule's defaults; connecting in the background");
                let d = Deferred::start(c, url, e)
                    .map_err(|e| format!("{origin}: limits class `{}`: {e}", c.name))?;
                loading.0.push(d.clone());
                d
            }
        };
        out.push((c.name.clone(), src));
    }
    Ok((out, loading))
}

/// Connects class `c`'s source to `url`.
fn connect(c: &LimitsClass, url: &str) -> Result<Arc<RedisLimits>, LimitsError> {
    let src = RedisLimits::builder(c).connect(url)?;
    tracing::info!(class = %c.name, redis = %url, buckets = src.buckets(), "limits class in Redis");
    let src = Arc::new(src);
    CONNECTED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push((c.name.clone(), Arc::downgrade(&src)));
    Ok(src)
}

/// A class in Redis not loaded yet: its keys answer [`Lookup::Unknown`] (the rule's
/// defaults), its entries cannot be changed, until the thread of [`Deferred::start`] connects
/// its source. Used only for a class that Redis did not answer at the start: a check then
/// pays one more `ArcSwap` load (no lock, no allocation).
struct Deferred {
    name: String,
    source: ArcSwapOption<RedisLimits>,
    /// The class as last reloaded (what the source is connected for).
    class: Mutex<LimitsClass>,
    /// Why the last attempt failed.
    error: Mutex<String>,
}

impl Deferred {
    /// The class's source, its connection tried again on a thread of its own until it is made
    /// (or the source is dropped with the engine and the server).
    fn start(c: &LimitsClass, url: &str, error: String) -> std::io::Result<Arc<Self>> {
        let d = Arc::new(Deferred {
            name: c.name.clone(),
            source: ArcSwapOption::empty(),
            class: Mutex::new(c.clone()),
            error: Mutex::new(error),
        });
        let weak = Arc::downgrade(&d);
        let url = url.to_owned();
        std::thread::Builder::new()
            .name("turnstile-limits-connect".into())
            .spawn(move || retry(weak, &url))?;
        Ok(d)
    }

    fn not_loaded(&self) -> LimitsError {
        LimitsError {
            origin: None,
            line: 0,
            message: format!(
                "limits class `{}` is not loaded from Redis yet (connecting in the background): try again",
                self.name
            ),
            setting: None,
        }
    }
}

/// Connects `d`'s source until Redis answers or `d` is dropped.
fn retry(d: Weak<Deferred>, url: &str) {
    let mut wait = FIRST_RETRY;
    loop {
        std::thread::sleep(wait);
        wait = (wait * 2).min(MAX_RETRY);
        let Some(d) = d.upgrade() else { return };
        let class = d.class.lock().unwrap_or_else(|e| e.into_inner()).clone();
        match connect(&class, url) {
            Ok(src) => {
                // A reload while connecting: the latest class.
                let latest = d.class.lock().unwrap_or_else(|e| e.into_inner()).clone();
                if let Err(e) = src.reclass(&latest) {
                    tracing::error!(class = %d.name, error = %e, "limits class not reclassed");
                }
                d.source.store(Some(src));
                tracing::info!(class = %d.name, "limits class in Redis loaded");
                return;
            }
            Err(e) => *d.error.lock().unwrap_or_else(|e| e.into_inner()) = e.to_string(),
        }
    }
}

impl LimitsSource for Deferred {
    #[inline]
    fn get(&self, id: u64) -> Lookup {
        match &*self.source.load() {
            Some(s) => s.get(id),
            None => Lookup::Unknown,
        }
    }

    fn prefetch(&self, id: u64) {
        if let Some(s) = &*self.source.load() {
            s.prefetch(id);
        }
    }

    fn get_fetching(&self, id: u64, fetch: &dyn Fn()) -> Lookup {
        match &*self.source.load() {
            Some(s) => s.get_fetching(id, fetch),
            None => {
                fetch();
                Lookup::Unknown
            }
        }
    }

    fn entry(&self, id: u64) -> Option<KeyLimit> {
        self.source.load().as_ref()?.entry(id)
    }

    fn set(&self, id: u64, limit: &KeyLimit) -> Result<(), LimitsError> {
        match &*self.source.load() {
            Some(s) => s.set(id, limit),
            None => Err(self.not_loaded()),
        }
    }

    fn remove(&self, id: u64) -> Result<bool, LimitsError> {
        match &*self.source.load() {
            Some(s) => s.remove(id),
            None => Err(self.not_loaded()),
        }
    }

    fn len(&self) -> u64 {
        self.source.load().as_ref().map_or(0, |s| s.len())
    }

    fn bytes(&self) -> usize {
        self.source.load().as_ref().map_or(0, |s| s.bytes())
    }

    fn export(&self, f: &mut dyn FnMut(u64, &KeyLimit)) {
        if let Some(s) = &*self.source.load() {
            s.export(f);
        }
    }

    fn reclass(&self, class: &LimitsClass) -> Result<(), LimitsError> {
        if let Some(s) = &*self.source.load() {
            s.reclass(class)?;
        }
        *self.class.lock().unwrap_or_else(|e| e.into_inner()) = class.clone();
        Ok(())
    }

    fn refresh(&self) -> Result<Option<turnstile::rules::limits::LoadReport>, LimitsError> {
        match &*self.source.load() {
            Some(s) => s.refresh(),
            None => Ok(None),
        }
    }
}

//! [`MemoryLimits`]: a class's entries in this process — the compact map (`map`), the plans,
//! and the distinct limits of their own that keys were given, each kept once.
//!
//! Reads (`get`) take no lock: one `ArcSwap` load of the current tables, one map lookup, one
//! plan or value read. Writes (`set`, `remove`, a file re-read, a new class) take the writer
//! lock; a re-read builds new tables aside and swaps them in whole, so a check sees the old
//! entries or the new ones, never a mix.

use super::entry::{KeyLimit, LimitsClass};
use super::file::{self, LoadReport};
use super::map::{IdMap, Put};
use super::{LimitsError, LimitsSource, Lookup};
use crate::algo::{Limit, LimitSpec};
use crate::keyed::KeyHasher;
use arc_swap::ArcSwap;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// Entries with this bit name a value of their own; the others, a plan.
const OWN: u32 = 1 << 31;
/// Values per segment of the first segment; each next one doubles.
const SEG0: u32 = 64;
const SEGMENTS: usize = 25;

/// A limit of a key's own: compiled, and as it was given.
type Value = (Limit, LimitSpec);

/// One segment of [`Values`]: each value written once.
type Segment = Box<[OnceLock<Value>]>;

/// An append-only table of the distinct limits keys were given, readable without a lock: an
/// index, once handed out, names its value for the table's life.
struct Values {
    segments: [OnceLock<Segment>; SEGMENTS],
}

impl Values {
    fn new() -> Self {
        Self {
            segments: std::array::from_fn(|_| OnceLock::new()),
        }
    }

    /// Segment and offset of index `i`.
    #[inline]
    fn place(i: u32) -> (usize, usize) {
        let j = i as u64 + SEG0 as u64;
        let k = 63 - j.leading_zeros() - SEG0.trailing_zeros();
        (k as usize, (j - ((SEG0 as u64) << k)) as usize)
    }

    #[inline]
    fn get(&self, i: u32) -> Option<&Value> {
        let (k, off) = Self::place(i);
        self.segments.get(k)?.get()?.get(off)?.get()
    }

    /// Stores value `i` (the writer's next index).
    fn put(&self, i: u32, v: Value) -> Result<(), LimitsError> {
        let (k, off) = Self::place(i);
        let seg = self
            .segments
            .get(k)
            .ok_or_else(|| LimitsError::new("too many distinct limits in one class"))?
            .get_or_init(|| (0..(SEG0 as usize) << k).map(|_| OnceLock::new()).collect());
        let _ = seg[off].set(v);
        Ok(())
    }

    fn bytes(&self) -> usize {
        let per = std::mem::size_of::<OnceLock<Value>>();
        self.segments
            .iter()
            .filter_map(|s| s.get())
            .map(|s| s.len() * per)
            .sum::<usize>()
            + std::mem::size_of::<Self>()
    }
}

/// What a check reads: the entries, the values they name, the plans resolved.
struct Tables {
    map: Arc<IdMap>,
    values: Arc<Values>,
    /// The limit of each plan name the class has had (by index), `None` once it is gone.
    plans: Box<[Option<Limit>]>,
}

/// What writers share (under the writer lock).
struct Writer {
    class: LimitsClass,
    /// Plan names by index (never reused), and their index.
    names: Vec<String>,
    index: HashMap<String, u32>,
    /// Distinct own limits, and their value index.
    interned: HashMap<LimitSpec, u32>,
    /// The file's (modified time, length) when it was last read.
    stamp: Option<(std::time::SystemTime, u64)>,
    /// The file's stamp when it was last refused, and why: not read again until it changes.
    refused: Option<((std::time::SystemTime, u64), LimitsError)>,
}

/// A limits class's entries in this process (see the module docs).
pub struct MemoryLimits {
    tables: ArcSwap<Tables>,
    writer: Mutex<Writer>,
    hasher: KeyHasher,
}

impl MemoryLimits {
    /// An empty class of entries, with room for `class.capacity` keys. Key text is turned
    /// into ids by `hasher` (the engine's) under the class's key class. A class with a file
    /// loads it ([`MemoryLimits::load`]).
    pub fn new(class: &LimitsClass, hasher: KeyHasher) -> Result<Self, LimitsError> {
        class.check()?;
        let plans = class.built_plans()?;
        let names: Vec<String> = plans.iter().map(|(n, _)| n.clone()).collect();
        let index = names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.clone(), i as u32))
            .collect();
        let s = Self {
            tables: ArcSwap::from_pointee(Tables {
                map: Arc::new(IdMap::new(class.capacity, map_seed(&hasher))),
                values: Arc::new(Values::new()),
                plans: plans.into_iter().map(|(_, l)| Some(l)).collect(),
            }),
            writer: Mutex::new(Writer {
                class: class.clone(),
                names,
                index,
                interned: HashMap::new(),
                stamp: None,
                refused: None,
            }),
            hasher,
        };
        if class.file.is_some() {
            s.load()?;
        }
        Ok(s)
    }

    fn writer(&self) -> std::sync::MutexGuard<'_, Writer> {
        self.writer.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The key id of `key` (text) in this class, as the rules engine computes it.
    pub fn key_id(&self, key: &str) -> Result<u64, LimitsError> {
        let class = self.writer().class.key;
        file::key_id(class, key, &self.hasher)
    }

    /// (Re-)reads the class's file into new tables and swaps them in: every entry is the
    /// file's (live changes since the last read are dropped). A line with an error refuses
    /// the file (`file:line: message`), and the entries stay as they were.
    pub fn load(&self) -> Result<LoadReport, LimitsError> {
        let mut w = self.writer();
        self.load_locked(&mut w)
    }

    fn load_locked(&self, w: &mut Writer) -> Result<LoadReport, LimitsError> {
        let Some(path) = w.class.file.clone() else {
            return Err(LimitsError::new(format!(
                "class `{}` has no file to load",
                w.class.name
            )));
        };
        let started = std::time::Instant::now();
        let stamp = file::stamp(&path)?;
        let lines = file::count_lines(&path)?;
        // Sized for the file (its lines bound its entries) or the class's capacity, whichever
        // is larger: live changes beyond that wait for `capacity` to be raised.
        let map = IdMap::new(w.class.capacity.max(lines), map_seed(&self.hasher));
        let values = Values::new();
        let mut interned = HashMap::new();
        let class = &w.class;
        let index = &w.index;
        let entries = file::read(&path, class, &self.hasher, |id, v| {
            let e = match v.plan() {
                Some(p) => *index.get(p).ok_or_else(|| {
                    LimitsError::new(format!(
                        "class `{}` has no plan `{p}`; its plans: {}",
                        class.name,
                        class
                            .plans
                            .iter()
                            .map(|(n, _)| n.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ))
                })?,
                None => {
                    let spec = v
                        .spec(class)?
                        .ok_or_else(|| LimitsError::new("neither a plan nor a limit"))?;
                    let limit = class.build(&spec)?;
                    own_index(&values, &mut interned, &spec, limit)?
                }
            };
            match map.put(id, e) {
                Put::Added => Ok(()),
                Put::Replaced(_) => {
                    Err(LimitsError::new("this key has an entry on an earlier line"))
                }
                Put::Full => Err(LimitsError::new("more entries than lines")),
            }
        })?;
        let plans = resolve_plans(&w.class, &w.names);
        self.tables.store(Arc::new(Tables {
            map: Arc::new(map),
            values: Arc::new(values),
            plans,
        }));
        (w.interned, w.stamp) = (interned, Some(stamp));
        Ok(LoadReport {
            entries,
            seconds: started.elapsed().as_secs_f64(),
        })
    }
}

/// The placement seed of a class's map: the hasher's, so ids are placed unpredictably.
fn map_seed(h: &KeyHasher) -> u64 {
    h.place(0x6c69_6d69_7473)
}

/// The index of plan `name`, added if new.
fn plan_index(names: &mut Vec<String>, index: &mut HashMap<String, u32>, name: &str) -> u32 {
    if let Some(&i) = index.get(name) {
        return i;
    }
    names.push(name.to_string());
    let i = names.len() as u32 - 1;
    index.insert(name.to_string(), i);
    i
}

/// The entry for a limit of a key's own: its value, stored once per distinct limit.
fn own_index(
    values: &Values,
    interned: &mut HashMap<LimitSpec, u32>,
    spec: &LimitSpec,
    limit: Limit,
) -> Result<u32, LimitsError> {
    if let Some(&i) = interned.get(spec) {
        return Ok(OWN | i);
    }
    let i = interned.len() as u32;
    if i >= OWN {
        return Err(LimitsError::new("too many distinct limits in one class"));
    }
    values.put(i, (limit, spec.clone()))?;
    interned.insert(spec.clone(), i);
    Ok(OWN | i)
}

/// Each plan name's limit under `class` (`None`: the class no longer has it).
fn resolve_plans(class: &LimitsClass, names: &[String]) -> Box<[Option<Limit>]> {
    names
        .iter()
        .map(|n| {
            let (_, spec) = class.plans.iter().find(|(p, _)| p == n)?;
            class.build(spec).ok()
        })
        .collect()
}

impl Tables {
    /// Key `id`'s own limit in these tables.
    #[inline]
    fn lookup(&self, id: u64) -> Lookup {
        let Some(e) = self.map.get(id) else {
            return Lookup::Default;
        };
        let limit = if e & OWN != 0 {
            self.values.get(e & !OWN).map(|v| v.0)
        } else {
            self.plans.get(e as usize).copied().flatten()
        };
        limit.map_or(Lookup::Default, Lookup::Own)
    }
}

impl LimitsSource for MemoryLimits {
    #[inline]
    fn get(&self, id: u64) -> Lookup {
        self.tables.load().lookup(id)
    }

    #[inline]
    fn prefetch(&self, id: u64) {
        self.tables.load().map.prefetch(id);
    }

    /// One load of the tables for the prefetch and the lookup: each `ArcSwap` load and guard
    /// drop is two locked instructions on the check path.
    #[inline]
    fn get_fetching(&self, id: u64, fetch: &dyn Fn()) -> Lookup {
        let t = self.tables.load();
        t.map.prefetch(id);
        fetch();
        t.lookup(id)
    }

    fn entry(&self, id: u64) -> Option<KeyLimit> {
        let w = self.writer();
        let t = self.tables.load();
        let e = t.map.get(id)?;
        Some(if e & OWN != 0 {
            KeyLimit::Limit(t.values.get(e & !OWN)?.1.clone())
        } else {
            KeyLimit::Plan(w.names.get(e as usize)?.clone())
        })
    }

    fn set(&self, id: u64, limit: &KeyLimit) -> Result<(), LimitsError> {
        let mut w = self.writer();
        let t = self.tables.load();
        let e = match limit {
            KeyLimit::Plan(p) => match w.index.get(p) {
                Some(&i) if t.plans.get(i as usize).is_some_and(Option::is_some) => i,
                _ => {
                    let plans: Vec<&str> = w.class.plans.iter().map(|(n, _)| n.as_str()).collect();
                    return Err(LimitsError::new(format!(
                        "class `{}` has no plan `{p}`; its plans: {}",
                        w.class.name,
                        if plans.is_empty() {
                            "none".to_string()
                        } else {
                            plans.join(", ")
                        }
                    )));
                }
            },
            KeyLimit::Limit(spec) => {
                let limit = w.class.build(spec)?;
                own_index(&t.values, &mut w.interned, spec, limit)?
            }
        };
        match t.map.put(id, e) {
            Put::Full => Err(LimitsError::new(format!(
                "class `{}` holds {} keys, its capacity: raise `capacity`, or remove entries and \
                 reload (a removed key keeps its slot until then)",
                w.class.name,
                t.map.capacity()
            ))),
            _ => Ok(()),
        }
    }

    fn remove(&self, id: u64) -> Result<bool, LimitsError> {
        let _w = self.writer();
        Ok(self.tables.load().map.remove(id).is_some())
    }

    fn len(&self) -> u64 {
        self.tables.load().map.len()
    }

    fn bytes(&self) -> usize {
        let t = self.tables.load();
        t.map.bytes() + t.values.bytes() + t.plans.len() * std::mem::size_of::<Option<Limit>>()
    }

    fn export(&self, f: &mut dyn FnMut(u64, &KeyLimit)) {
        let names = self.writer().names.clone();
        let t = self.tables.load();
        t.map.for_each(|id, e| {
            let entry = if e & OWN != 0 {
                t.values.get(e & !OWN).map(|v| KeyLimit::Limit(v.1.clone()))
            } else {
                names.get(e as usize).map(|n| KeyLimit::Plan(n.clone()))
            };
            if let Some(entry) = entry {
                f(id, &entry);
            }
        });
    }

    fn reclass(&self, class: &LimitsClass) -> Result<(), LimitsError> {
        class.check()?;
        class.built_plans()?;
        let mut w = self.writer();
        if (class.key, class.algorithm, class.window)
            != (w.class.key, w.class.algorithm, w.class.window)
        {
            return Err(LimitsError::new(format!(
                "class `{}` changed its key, algorithm or window: its entries cannot follow",
                class.name
            )));
        }
        let mut names = w.names.clone();
        let mut index = w.index.clone();
        for (n, _) in &class.plans {
            plan_index(&mut names, &mut index, n);
        }
        let t = self.tables.load();
        let map = if class.capacity != w.class.capacity && class.file.is_none() {
            // A new capacity: the entries move to a map of that size (the writer lock keeps
            // them from changing meanwhile).
            let m = IdMap::new(class.capacity.max(t.map.len()), map_seed(&self.hasher));
            t.map.for_each(|id, e| {
                m.put(id, e);
            });
            Arc::new(m)
        } else {
            t.map.clone()
        };
        self.tables.store(Arc::new(Tables {
            map,
            values: t.values.clone(),
            plans: resolve_plans(class, &names),
        }));
        let file_changed = class.file != w.class.file || class.capacity != w.class.capacity;
        (w.names, w.index, w.class) = (names, index, class.clone());
        if file_changed {
            (w.stamp, w.refused) = (None, None);
        }
        Ok(())
    }

    fn refresh(&self) -> Result<Option<LoadReport>, LimitsError> {
        let mut w = self.writer();
        let Some(path) = &w.class.file else {
            return Ok(None);
        };
        let now = file::stamp(path).ok();
        if w.stamp.is_some() && w.stamp == now {
            return Ok(None);
        }
        // A file refused as it is now: the same refusal, without reading it again (a large
        // file left bad would otherwise be read at every look).
        if let (Some((at, e)), Some(now)) = (&w.refused, now) {
            if *at == now {
                return Err(e.clone());
            }
        }
        match self.load_locked(&mut w) {
            Ok(r) => {
                w.refused = None;
                Ok(Some(r))
            }
            Err(e) => {
                w.refused = now.map(|n| (n, e.clone()));
                Err(e)
            }
        }
    }
}

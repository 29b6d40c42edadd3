//! The narrow interface through which the map syncer touches the kernel:
//! put, delete and dump of raw entries of the three maps userspace owns.
//! [`KernelMaps`] is the real one (aya maps pinned under bpffs);
//! [`FakeMaps`] keeps entries in memory for unit tests and can be told to
//! fail.

use std::collections::BTreeMap;

use aya::maps::{HashMap as BpfHashMap, MapData, MapError};

use super::layout::{
    BackendKeyBytes, BackendValueBytes, MemberKeyBytes, SvcKeyBytes, SvcValueBytes,
};

/// The maps keelson writes from userspace. (`kl_affinity` and `kl_revnat`
/// are written by the programs only.)
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LbMap {
    /// `kl_services`: (VIP, port, proto) -> service entry.
    Services,
    /// `kl_backends`: (service id, generation, slot) -> backend.
    Backends,
    /// `kl_members`: (service id, backend) -> 1.
    Members,
}

impl LbMap {
    /// The map's name in the object and its pin file name.
    pub fn name(self) -> &'static str {
        match self {
            LbMap::Services => "kl_services",
            LbMap::Backends => "kl_backends",
            LbMap::Members => "kl_members",
        }
    }
}

/// A map operation that failed.
#[derive(Debug, thiserror::Error)]
#[error("{op} in map {map}: {detail}")]
pub struct MapsError {
    /// Which map.
    pub map: &'static str,
    /// put, delete or dump.
    pub op: &'static str,
    /// What the kernel (or the fake) said.
    pub detail: String,
    /// The kernel's errno, when it gave one.
    pub errno: Option<i32>,
}

impl MapsError {
    /// Whether the map is full (`E2BIG` from a hash map update).
    pub fn is_full(&self) -> bool {
        self.errno == Some(libc::E2BIG)
    }
}

/// Every entry of a map as raw (key, value) bytes.
pub type RawEntries = Vec<(Vec<u8>, Vec<u8>)>;

/// Raw access to the userspace-owned maps.
pub trait LbMaps {
    /// Creates or replaces one entry.
    fn put(&mut self, map: LbMap, key: &[u8], value: &[u8]) -> Result<(), MapsError>;
    /// Deletes one entry; a missing entry is not an error.
    fn delete(&mut self, map: LbMap, key: &[u8]) -> Result<(), MapsError>;
    /// Every entry of the map (used at start and after an error only).
    fn dump(&self, map: LbMap) -> Result<RawEntries, MapsError>;
    /// Calls `f` with every entry of the map, collecting nothing (the
    /// read-back at start and on verification: at 10,000 Services the maps
    /// hold ~240,000 entries).
    fn scan(&self, map: LbMap, f: &mut dyn FnMut(&[u8], &[u8])) -> Result<(), MapsError> {
        for (k, v) in self.dump(map)? {
            f(&k, &v);
        }
        Ok(())
    }
    /// Calls `f` with every key of the map; values are not read (one
    /// system call per entry instead of two).
    fn scan_keys(&self, map: LbMap, f: &mut dyn FnMut(&[u8])) -> Result<(), MapsError> {
        self.scan(map, &mut |k, _| f(k))
    }
    /// One entry's value; `None` when the key is not in the map.
    fn get(&self, map: LbMap, key: &[u8]) -> Result<Option<Vec<u8>>, MapsError>;
}

/// The pinned kernel maps, opened through aya.
pub struct KernelMaps {
    services: BpfHashMap<MapData, SvcKeyBytes, SvcValueBytes>,
    backends: BpfHashMap<MapData, BackendKeyBytes, BackendValueBytes>,
    members: BpfHashMap<MapData, MemberKeyBytes, u8>,
}

impl std::fmt::Debug for KernelMaps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelMaps").finish_non_exhaustive()
    }
}

fn err(map: LbMap, op: &'static str, e: impl std::fmt::Display) -> MapsError {
    MapsError {
        map: map.name(),
        op,
        detail: e.to_string(),
        errno: None,
    }
}

fn kernel_err(map: LbMap, op: &'static str, e: &MapError) -> MapsError {
    let errno = match e {
        MapError::SyscallError(s) => s.io_error.raw_os_error(),
        _ => None,
    };
    MapsError {
        errno,
        ..err(map, op, e)
    }
}

fn fixed<const N: usize>(map: LbMap, op: &'static str, b: &[u8]) -> Result<[u8; N], MapsError> {
    b.try_into()
        .map_err(|_| err(map, op, format!("key of {} bytes, expected {N}", b.len())))
}

fn is_not_found(e: &MapError) -> bool {
    match e {
        MapError::KeyNotFound => true,
        MapError::SyscallError(s) => s.io_error.raw_os_error() == Some(libc::ENOENT),
        _ => false,
    }
}

impl KernelMaps {
    /// Wraps the three maps (as taken from the loaded object or opened from
    /// their pins).
    pub fn new(services: MapData, backends: MapData, members: MapData) -> Result<Self, MapsError> {
        Ok(KernelMaps {
            services: BpfHashMap::try_from(aya::maps::Map::HashMap(services))
                .map_err(|e| err(LbMap::Services, "open", e))?,
            backends: BpfHashMap::try_from(aya::maps::Map::HashMap(backends))
                .map_err(|e| err(LbMap::Backends, "open", e))?,
            members: BpfHashMap::try_from(aya::maps::Map::HashMap(members))
                .map_err(|e| err(LbMap::Members, "open", e))?,
        })
    }
}

impl LbMaps for KernelMaps {
    fn put(&mut self, map: LbMap, key: &[u8], value: &[u8]) -> Result<(), MapsError> {
        let r = match map {
            LbMap::Services => {
                let v: SvcValueBytes = fixed(map, "put", value)?;
                self.services.insert(fixed(map, "put", key)?, v, 0)
            }
            LbMap::Backends => {
                let v: BackendValueBytes = fixed(map, "put", value)?;
                self.backends.insert(fixed(map, "put", key)?, v, 0)
            }
            LbMap::Members => {
                let v = value.first().copied().unwrap_or(1);
                self.members.insert(fixed(map, "put", key)?, v, 0)
            }
        };
        r.map_err(|e| kernel_err(map, "put", &e))
    }

    fn delete(&mut self, map: LbMap, key: &[u8]) -> Result<(), MapsError> {
        let r = match map {
            LbMap::Services => self.services.remove(&fixed(map, "delete", key)?),
            LbMap::Backends => self.backends.remove(&fixed(map, "delete", key)?),
            LbMap::Members => self.members.remove(&fixed(map, "delete", key)?),
        };
        match r {
            Err(e) if !is_not_found(&e) => Err(kernel_err(map, "delete", &e)),
            _ => Ok(()),
        }
    }

    fn dump(&self, map: LbMap) -> Result<RawEntries, MapsError> {
        fn collect<K: aya::Pod + AsRef<[u8]>, V: aya::Pod>(
            map: LbMap,
            m: &BpfHashMap<MapData, K, V>,
            value_bytes: impl Fn(&V) -> Vec<u8>,
        ) -> Result<RawEntries, MapsError> {
            let mut out = Vec::new();
            for entry in m.iter() {
                match entry {
                    Ok((k, v)) => out.push((k.as_ref().to_vec(), value_bytes(&v))),
                    // Deleted between the key walk and the lookup: skip it.
                    Err(e) if is_not_found(&e) => {}
                    Err(e) => return Err(err(map, "dump", e)),
                }
            }
            Ok(out)
        }
        match map {
            LbMap::Services => collect(map, &self.services, |v| v.to_vec()),
            LbMap::Backends => collect(map, &self.backends, |v| v.to_vec()),
            LbMap::Members => collect(map, &self.members, |v| vec![*v]),
        }
    }

    fn scan(&self, map: LbMap, f: &mut dyn FnMut(&[u8], &[u8])) -> Result<(), MapsError> {
        fn each<K: aya::Pod + AsRef<[u8]>, V: aya::Pod>(
            map: LbMap,
            m: &BpfHashMap<MapData, K, V>,
            f: &mut dyn FnMut(&[u8], &[u8]),
            value_bytes: impl Fn(&V) -> &[u8],
        ) -> Result<(), MapsError> {
            for entry in m.iter() {
                match entry {
                    Ok((k, v)) => f(k.as_ref(), value_bytes(&v)),
                    // Deleted between the key walk and the lookup: skip it.
                    Err(e) if is_not_found(&e) => {}
                    Err(e) => return Err(err(map, "dump", e)),
                }
            }
            Ok(())
        }
        match map {
            LbMap::Services => each(map, &self.services, f, |v| v.as_slice()),
            LbMap::Backends => each(map, &self.backends, f, |v| v.as_slice()),
            LbMap::Members => each(map, &self.members, f, std::slice::from_ref),
        }
    }

    fn scan_keys(&self, map: LbMap, f: &mut dyn FnMut(&[u8])) -> Result<(), MapsError> {
        fn each<K: aya::Pod + AsRef<[u8]>, V: aya::Pod>(
            map: LbMap,
            m: &BpfHashMap<MapData, K, V>,
            f: &mut dyn FnMut(&[u8]),
        ) -> Result<(), MapsError> {
            for key in m.keys() {
                match key {
                    Ok(k) => f(k.as_ref()),
                    Err(e) => return Err(err(map, "dump", e)),
                }
            }
            Ok(())
        }
        match map {
            LbMap::Services => each(map, &self.services, f),
            LbMap::Backends => each(map, &self.backends, f),
            LbMap::Members => each(map, &self.members, f),
        }
    }

    fn get(&self, map: LbMap, key: &[u8]) -> Result<Option<Vec<u8>>, MapsError> {
        let r = match map {
            LbMap::Services => self
                .services
                .get(&fixed(map, "get", key)?, 0)
                .map(|v| v.to_vec()),
            LbMap::Backends => self
                .backends
                .get(&fixed(map, "get", key)?, 0)
                .map(|v| v.to_vec()),
            LbMap::Members => self
                .members
                .get(&fixed(map, "get", key)?, 0)
                .map(|v| vec![v]),
        };
        match r {
            Ok(v) => Ok(Some(v)),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(kernel_err(map, "get", &e)),
        }
    }
}

/// In-memory maps for unit tests; counts operations and fails on demand.
#[derive(Debug, Default, Clone)]
pub struct FakeMaps {
    /// Entries per map.
    pub entries: BTreeMap<LbMap, BTreeMap<Vec<u8>, Vec<u8>>>,
    /// Every successful put and delete, in order.
    pub log: Vec<(LbMap, &'static str, Vec<u8>)>,
    /// When set, the put or delete with this index (counting every call
    /// since creation) fails.
    pub fail_at: Option<usize>,
    /// Entries a map may hold; a put of a new key beyond that fails as
    /// the kernel's does (`E2BIG`).
    pub capacity: BTreeMap<LbMap, usize>,
    /// Whole-map reads (dumps and scans) so far.
    pub reads: std::cell::Cell<usize>,
    calls: usize,
}

impl FakeMaps {
    /// Entries of one map.
    pub fn map(&self, map: LbMap) -> BTreeMap<Vec<u8>, Vec<u8>> {
        self.entries.get(&map).cloned().unwrap_or_default()
    }

    fn check_fail(&mut self, map: LbMap, op: &'static str) -> Result<(), MapsError> {
        let n = self.calls;
        self.calls += 1;
        if self.fail_at == Some(n) {
            return Err(err(map, op, "injected failure"));
        }
        Ok(())
    }
}

impl LbMaps for FakeMaps {
    fn put(&mut self, map: LbMap, key: &[u8], value: &[u8]) -> Result<(), MapsError> {
        self.check_fail(map, "put")?;
        let entries = self.entries.entry(map).or_default();
        if let Some(cap) = self.capacity.get(&map)
            && entries.len() >= *cap
            && !entries.contains_key(key)
        {
            return Err(MapsError {
                errno: Some(libc::E2BIG),
                ..err(map, "put", "map full")
            });
        }
        entries.insert(key.to_vec(), value.to_vec());
        self.log.push((map, "put", key.to_vec()));
        Ok(())
    }

    fn delete(&mut self, map: LbMap, key: &[u8]) -> Result<(), MapsError> {
        self.check_fail(map, "delete")?;
        if let Some(m) = self.entries.get_mut(&map) {
            m.remove(key);
        }
        self.log.push((map, "delete", key.to_vec()));
        Ok(())
    }

    fn dump(&self, map: LbMap) -> Result<RawEntries, MapsError> {
        self.reads.set(self.reads.get() + 1);
        Ok(self
            .entries
            .get(&map)
            .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default())
    }

    fn get(&self, map: LbMap, key: &[u8]) -> Result<Option<Vec<u8>>, MapsError> {
        Ok(self.entries.get(&map).and_then(|m| m.get(key)).cloned())
    }
}

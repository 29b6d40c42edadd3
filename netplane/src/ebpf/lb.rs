//! Loading, attaching, pinning and removing the socket LB.
//!
//! Pins live under `bpffs_path` (default `/sys/fs/bpf/keelson`):
//! - `maps/kl_services`, `maps/kl_backends`, `maps/kl_members`,
//!   `maps/kl_affinity`, `maps/kl_revnat`
//! - `links/connect4`, `links/connect6`, `links/sendmsg4`, ... (cgroup BPF
//!   links; each holds its program)
//!
//! Because the links are pinned, the programs stay attached and keep
//! translating with the pinned maps while keelson is stopped or restarting.
//! A starting keelson loads its own programs against the same maps,
//! attaches them next to the running ones and then replaces the pins, which
//! detaches the old programs. During that overlap both run in turn: the
//! first one translates, the second sees a backend address (not in
//! `kl_services`) or a Service address (not in `kl_revnat`) and passes, so
//! there is no moment without translation and none with a double one.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::path::{Path, PathBuf};

use aya::maps::{HashMap as BpfHashMap, Map, MapData, MapInfo, MapType};
use aya::programs::links::{FdLink, PinnedLink};
use aya::programs::{CgroupAttachMode, CgroupSockAddr};
use aya::util::KernelVersion;
use aya::{Ebpf, EbpfLoader};

use super::error::{EbpfError, chain};
use super::fs::{cgroup2_root, ensure_bpffs, is_cgroup2};
use super::layout::LbService;
use super::layout::{
    AffinityEntry, AffinityKeyBytes, AffinityValueBytes, Frontend, RevNatEntry, RevNatKeyBytes,
    RevNatValueBytes, decode_affinity, decode_revnat,
};
use super::maps::KernelMaps;
use super::object::{MAPS, MapSpec, PROGRAMS, SOCK_LB_OBJECT};
use super::pinlock::{self, PinLock};
use super::sizes::{MIN_SIZES, MapSizes};
use super::sync::{SyncError, SyncErrors, SyncStats, Syncer};

/// The oldest kernel with every hook the socket LB uses
/// (`cgroup/getpeername4/6` and `bpf_get_netns_cookie` for sock_addr
/// programs arrived in 5.8; BPF links for cgroups in 5.7).
pub const MIN_KERNEL: (u8, u8) = (5, 8);

/// Where the socket LB attaches and pins (`proxy.mode: ebpf`; the fields
/// of keelson's `proxy.ebpf` configuration section).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EbpfConfig {
    /// cgroup v2 directory whose processes' sockets are load-balanced,
    /// descendants included (`proxy.ebpf.cgroupPath`). `None`: the node's
    /// cgroup v2 root, i.e. every process on the node.
    pub cgroup_path: Option<PathBuf>,
    /// Directory on bpffs for keelson's pins (`proxy.ebpf.bpffsPath`,
    /// default `/sys/fs/bpf/keelson`). Its parent must be a bpffs; when it is
    /// not, bpffs is mounted there.
    pub bpffs_path: PathBuf,
}

impl Default for EbpfConfig {
    fn default() -> Self {
        EbpfConfig {
            cgroup_path: None,
            bpffs_path: PathBuf::from("/sys/fs/bpf/keelson"),
        }
    }
}

impl EbpfConfig {
    /// The pin directory (`bpffs_path`).
    pub fn pin_dir(&self) -> PathBuf {
        self.bpffs_path.clone()
    }

    /// Where bpffs is (or gets) mounted: the parent of `bpffs_path`.
    pub fn bpffs_mount_point(&self) -> Result<PathBuf, EbpfError> {
        match self.bpffs_path.parent() {
            Some(p) if !p.as_os_str().is_empty() && self.bpffs_path.is_absolute() => {
                Ok(p.to_path_buf())
            }
            _ => Err(EbpfError::io(
                "bpffsPath must be an absolute directory below a bpffs mount",
                &self.bpffs_path,
                std::io::Error::from(std::io::ErrorKind::InvalidInput),
            )),
        }
    }

    fn maps_dir(&self) -> PathBuf {
        self.pin_dir().join("maps")
    }

    fn links_dir(&self) -> PathBuf {
        self.pin_dir().join("links")
    }

    /// The cgroup to attach to: the configured one or the node's root.
    pub fn resolved_cgroup(&self) -> Result<PathBuf, EbpfError> {
        match &self.cgroup_path {
            Some(p) => Ok(p.clone()),
            None => cgroup2_root(),
        }
    }
}

/// Checks, without attaching or pinning anything, that this kernel and node
/// can run the socket LB: kernel version, the cgroup v2 directory, and that
/// every program loads (the verifier accepts it for its hook). The wiring
/// calls it at start; on `Err(EbpfError::Unsupported)` it either stops with
/// that message or, when configured to, falls back to nftables.
pub fn check_support(config: &EbpfConfig) -> Result<(), EbpfError> {
    check_kernel_version()?;
    let cgroup = config.resolved_cgroup()?;
    if !is_cgroup2(&cgroup) {
        return Err(EbpfError::Unsupported {
            reason: format!(
                "{} is not a cgroup v2 directory (the socket LB attaches to cgroup v2)",
                cgroup.display()
            ),
        });
    }
    // Tiny maps: the LRU maps preallocate every entry.
    let mut loader = loader();
    for spec in MAPS {
        loader.map_max_entries(spec.name, 64);
    }
    let mut bpf = loader
        .load(SOCK_LB_OBJECT)
        .map_err(|e| unsupported_or("loading the socket-LB object", &e))?;
    load_programs(&mut bpf)
}

/// An object loader without the kernel's BTF: the programs read their
/// context's fields directly and need no CO-RE relocation. aya's
/// `EbpfLoader::new()` parses `/sys/kernel/btf/vmlinux` (5.5 MB here:
/// ~18 MiB of heap and ~100 ms) even when `.btf(None)` follows
/// (aya-rs/aya#1172); `without_kernel_btf` is keelson's patch of aya
/// (`vendor/aya`), which never reads it.
fn loader<'a>() -> EbpfLoader<'a> {
    EbpfLoader::without_kernel_btf()
}

fn check_kernel_version() -> Result<(), EbpfError> {
    let (major, minor) = MIN_KERNEL;
    match KernelVersion::current() {
        Ok(v) if v < KernelVersion::new(major, minor, 0) => Err(EbpfError::Unsupported {
            reason: format!(
                "kernel {v} lacks cgroup getpeername hooks and netns cookies for sock_addr \
                 programs (needs {major}.{minor} or newer)"
            ),
        }),
        // Unknown version string: let the program loads decide.
        _ => Ok(()),
    }
}

/// Errors that mean "this kernel cannot" become `Unsupported`; a missing
/// privilege is said as such.
fn unsupported_or(context: &str, e: &dyn std::error::Error) -> EbpfError {
    let text = chain(e);
    if text.contains("Operation not permitted") || text.contains("EPERM") {
        return EbpfError::bpf_msg(
            context,
            format!(
                "{text} (the socket LB needs root, or CAP_BPF + CAP_NET_ADMIN + CAP_SYS_ADMIN)"
            ),
        );
    }
    EbpfError::Unsupported {
        reason: format!("{context}: {text}"),
    }
}

fn program<'a>(bpf: &'a mut Ebpf, func: &str) -> Result<&'a mut CgroupSockAddr, EbpfError> {
    let p = bpf
        .program_mut(func)
        .ok_or_else(|| EbpfError::bpf_msg("embedded object", format!("program {func} missing")))?;
    p.try_into()
        .map_err(|e| EbpfError::bpf(format!("program {func}"), e))
}

/// The running socket LB: programs attached through pinned links, pinned
/// maps, and the syncer that writes them.
pub struct SocketLb {
    /// Held for the whole life of the socket LB (see [`super::pinlock`]).
    _pins: PinLock,
    config: EbpfConfig,
    cgroup: PathBuf,
    /// Sizes of the Service maps in use.
    sizes: MapSizes,
    /// A rebuild failed half-way: the next apply rebuilds.
    rebuild: bool,
    syncer: Syncer<KernelMaps>,
    affinity: BpfHashMap<MapData, AffinityKeyBytes, AffinityValueBytes>,
    revnat: BpfHashMap<MapData, RevNatKeyBytes, RevNatValueBytes>,
}

impl std::fmt::Debug for SocketLb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SocketLb")
            .field("config", &self.config)
            .field("cgroup", &self.cgroup)
            .field("frontends", &self.syncer.written_len())
            .field("sizes", &self.sizes)
            .finish_non_exhaustive()
    }
}

impl SocketLb {
    /// Loads the programs, attaches them to the cgroup and pins links and
    /// maps; reuses maps a previous keelson pinned (their services keep
    /// being served until [`SocketLb::replace_all`] changes them). Returns
    /// the deletions made while adopting the maps. New maps get the
    /// smallest sizes ([`MIN_SIZES`]); the first sync that needs more
    /// rebuilds them (see [`SocketLb::apply`]).
    pub fn start(config: &EbpfConfig) -> Result<(SocketLb, SyncStats), EbpfError> {
        check_kernel_version()?;
        let cgroup = config.resolved_cgroup()?;
        if !is_cgroup2(&cgroup) {
            return Err(EbpfError::Unsupported {
                reason: format!("{} is not a cgroup v2 directory", cgroup.display()),
            });
        }
        ensure_bpffs(&config.bpffs_mount_point()?)?;
        for dir in [config.pin_dir(), config.maps_dir(), config.links_dir()] {
            std::fs::create_dir_all(&dir)
                .map_err(|e| EbpfError::io("creating the pin directory", &dir, e))?;
        }
        let pins = pinlock::lock(&config.pin_dir(), pinlock::PIN_LOCK_WAIT)?;
        let maps_dir = config.maps_dir();
        for spec in MAPS {
            drop_incompatible_pin(&maps_dir.join(spec.name), spec)?;
            // A resize that died half-way.
            remove_if_present(&maps_dir.join(staging(spec.name)))?;
        }
        let paths = MAPS
            .iter()
            .map(|spec| (spec.name, maps_dir.join(spec.name)))
            .collect::<Vec<_>>();
        let t0 = std::time::Instant::now();
        let mut bpf = load_object(&paths, MIN_SIZES)?;
        let t1 = std::time::Instant::now();
        load_programs(&mut bpf)?;
        let t2 = std::time::Instant::now();
        attach(&mut bpf, &cgroup, &config.links_dir())?;
        let t3 = std::time::Instant::now();

        let (maps, sizes) = take_sized_maps(&mut bpf)?;
        let affinity = lru(take_map(&mut bpf, "kl_affinity")?, "kl_affinity")?;
        let revnat = lru(take_map(&mut bpf, "kl_revnat")?, "kl_revnat")?;
        let (syncer, stats) = Syncer::adopt(maps)?;
        let ms = |d: std::time::Duration| (d.as_secs_f64() * 1e4).round() / 10.0;
        tracing::info!(
            cgroup = %cgroup.display(),
            pins = %config.pin_dir().display(),
            adopted = syncer.written_len(),
            ?sizes,
            load_object_ms = ms(t1 - t0),
            load_programs_ms = ms(t2 - t1),
            attach_ms = ms(t3 - t2),
            adopt_ms = ms(t3.elapsed()),
            "eBPF socket LB attached"
        );
        Ok((
            SocketLb {
                _pins: pins,
                config: config.clone(),
                cgroup,
                sizes,
                rebuild: false,
                syncer,
                affinity,
                revnat,
            },
            stats,
        ))
    }

    /// The sizes of the Service maps in use.
    pub fn sizes(&self) -> MapSizes {
        self.sizes
    }

    /// Builds the Service maps anew with room for `sizes`, fills them with
    /// `desired`, then attaches a new set of programs that use them and
    /// puts their pins in place of the old ones. The old programs (and
    /// maps) keep translating until the new links replace theirs; the two
    /// sets overlap as in a restart (see the module docs), so no
    /// connection goes untranslated. `kl_affinity` and `kl_revnat` are
    /// kept, and every frontend keeps its id, so ClientIP affinity holds.
    fn rebuild(
        &mut self,
        sizes: MapSizes,
        desired: BTreeMap<Frontend, LbService>,
    ) -> Result<SyncStats, SyncErrors> {
        // Until it succeeds, every apply tries again: a failure half-way
        // may have left some hooks on the new maps.
        self.rebuild = true;
        let maps_dir = self.config.maps_dir();
        let resize_error = |e: EbpfError| SyncErrors(vec![SyncError::Resize(e.to_string())]);
        let mut paths = Vec::new();
        for spec in MAPS {
            let path = if sizes.of(spec.name).is_some() {
                let next = maps_dir.join(staging(spec.name));
                remove_if_present(&next).map_err(resize_error)?;
                next
            } else {
                maps_dir.join(spec.name)
            };
            paths.push((spec.name, path));
        }
        let mut bpf = load_object(&paths, sizes).map_err(resize_error)?;
        load_programs(&mut bpf).map_err(resize_error)?;
        let (maps, actual) = take_sized_maps(&mut bpf).map_err(resize_error)?;
        let (mut syncer, _) = Syncer::adopt(maps).map_err(|e| SyncErrors(vec![e]))?;
        syncer.keep_ids_of(&self.syncer, &desired);
        let stats = syncer.replace_all(desired)?;
        attach(&mut bpf, &self.cgroup, &self.config.links_dir()).map_err(resize_error)?;
        for spec in MAPS.iter().filter(|spec| sizes.of(spec.name).is_some()) {
            let pin = maps_dir.join(spec.name);
            std::fs::rename(maps_dir.join(staging(spec.name)), &pin)
                .map_err(|e| resize_error(EbpfError::io("replacing the map pin", &pin, e)))?;
        }
        tracing::info!(from = ?self.sizes, to = ?actual, frontends = syncer.written_len(),
            "socket-LB maps rebuilt");
        self.syncer = syncer;
        self.sizes = actual;
        self.rebuild = false;
        Ok(stats)
    }

    /// The sizes `desired` calls for, when the maps in use do not fit it:
    /// too small, or (`shrink`) more than four times too large.
    fn refit(&self, needed: MapSizes, shrink: bool) -> Option<MapSizes> {
        let target = MapSizes::with_room(needed);
        if self.rebuild || !self.sizes.holds(needed) {
            Some(if shrink {
                target
            } else {
                target.max(self.sizes)
            })
        } else if shrink && self.sizes.oversized_for(target) {
            Some(target)
        } else {
            None
        }
    }

    /// The configuration it was started with.
    pub fn config(&self) -> &EbpfConfig {
        &self.config
    }

    /// Detaches the programs and removes the pins this socket LB holds
    /// (see [`cleanup`]).
    pub fn remove(&self) -> Result<(), EbpfError> {
        remove_pins(&self.config)
    }

    /// The cgroup the programs are attached to.
    pub fn cgroup(&self) -> &Path {
        &self.cgroup
    }

    /// Applies changes to frontends (see [`Syncer::apply`]). When the
    /// maps cannot hold the result, they are rebuilt larger first (see
    /// [`MapSizes::with_room`]); a put that finds a map full anyway
    /// rebuilds them twice as large.
    pub fn apply(
        &mut self,
        changes: impl IntoIterator<Item = (Frontend, Option<LbService>)>,
    ) -> Result<SyncStats, SyncErrors> {
        let changes: Vec<_> = changes.into_iter().collect();
        if let Some(sizes) = self.refit(self.syncer.needed_after(&changes), false) {
            let mut desired = self.syncer.desired().clone();
            for (f, s) in changes {
                match s {
                    Some(s) => desired.insert(f, s),
                    None => desired.remove(&f),
                };
            }
            return self.rebuild(sizes, desired);
        }
        match self.syncer.apply(changes) {
            Err(e) if e.map_full() => {
                tracing::warn!(sizes = ?self.sizes, "a socket-LB map is full; rebuilding larger");
                let desired = self.syncer.desired().clone();
                self.rebuild(self.sizes.doubled(), desired)
            }
            other => other,
        }
    }

    /// Sets the complete set of frontends (see [`Syncer::replace_all`]);
    /// maps far larger than needed are rebuilt smaller.
    pub fn replace_all(
        &mut self,
        desired: BTreeMap<Frontend, LbService>,
    ) -> Result<SyncStats, SyncErrors> {
        match self.refit(MapSizes::needed(&desired), true) {
            Some(sizes) => self.rebuild(sizes, desired),
            None => self.syncer.replace_all(desired),
        }
    }

    /// Re-reads the maps and sets the complete set of frontends (see
    /// [`Syncer::verify_and_replace_all`]); resizes as
    /// [`SocketLb::replace_all`] does (new maps need no verifying).
    pub fn verify_and_replace_all(
        &mut self,
        desired: BTreeMap<Frontend, LbService>,
    ) -> Result<(SyncStats, bool), SyncErrors> {
        match self.refit(MapSizes::needed(&desired), true) {
            Some(sizes) => Ok((self.rebuild(sizes, desired)?, false)),
            None => self.syncer.verify_and_replace_all(desired),
        }
    }

    /// The service-port id written for a frontend.
    pub fn service_id(&self, f: &Frontend) -> Option<u32> {
        self.syncer.service_id(f)
    }

    /// Remembered backend choices (ClientIP affinity and UDP flows), for
    /// diagnosis.
    pub fn affinity_entries(&self) -> Vec<AffinityEntry> {
        self.affinity
            .iter()
            .filter_map(Result::ok)
            .filter_map(|(k, v)| decode_affinity(&k, &v))
            .collect()
    }

    /// Reverse translations (socket, backend) -> Service address, for
    /// diagnosis.
    pub fn revnat_entries(&self) -> Vec<RevNatEntry> {
        self.revnat
            .iter()
            .filter_map(Result::ok)
            .filter_map(|(k, v)| decode_revnat(&k, &v))
            .collect()
    }
}

/// The pin name a rebuilt map gets until it replaces the one in use
/// (bpffs refuses names with a dot).
fn staging(name: &str) -> String {
    format!("{name}_next")
}

/// Loads the object: its maps are opened from (or created and pinned at)
/// `paths`; the Service maps it creates get `sizes`.
fn load_object(paths: &[(&'static str, PathBuf)], sizes: MapSizes) -> Result<Ebpf, EbpfError> {
    let mut loader = loader();
    for (name, path) in paths {
        loader.map_pin_path(name, path.clone());
    }
    for spec in MAPS {
        if let Some(n) = sizes.of(spec.name) {
            loader.map_max_entries(spec.name, n);
        }
    }
    loader
        .load(SOCK_LB_OBJECT)
        .map_err(|e| unsupported_or("loading the socket-LB object", &e))
}

fn load_programs(bpf: &mut Ebpf) -> Result<(), EbpfError> {
    for (func, hook) in PROGRAMS {
        program(bpf, func)?
            .load()
            .map_err(|e| unsupported_or(&format!("loading the {hook} program"), &e))?;
    }
    Ok(())
}

/// Attaches every (loaded) program to `cgroup` and pins its link in
/// `links_dir`, replacing the link pinned there before.
fn attach(bpf: &mut Ebpf, cgroup: &Path, links_dir: &Path) -> Result<(), EbpfError> {
    let cgroup_dir =
        File::open(cgroup).map_err(|e| EbpfError::io("opening the cgroup", cgroup, e))?;
    for (func, hook) in PROGRAMS {
        let prog = program(bpf, func)?;
        let id = prog
            .attach(&cgroup_dir, CgroupAttachMode::Single)
            .map_err(|e| EbpfError::bpf(format!("attaching {hook} to {}", cgroup.display()), e))?;
        let link = prog
            .take_link(id)
            .map_err(|e| EbpfError::bpf(format!("taking the {hook} link"), e))?;
        let link = FdLink::try_from(link).map_err(|e| EbpfError::Unsupported {
            reason: format!("the kernel attached {hook} without a BPF link ({e}); needs 5.7+"),
        })?;
        let pin = links_dir.join(hook);
        let next = links_dir.join(staging(hook));
        let _ = std::fs::remove_file(&next);
        link.pin(&next)
            .map_err(|e| EbpfError::bpf(format!("pinning the {hook} link"), e))?;
        // Replacing the pin drops the previous link (if any): its program
        // is detached now that this one runs.
        std::fs::rename(&next, &pin)
            .map_err(|e| EbpfError::io("replacing the link pin", &pin, e))?;
    }
    Ok(())
}

/// The three Service maps of a loaded object, and their sizes.
fn take_sized_maps(bpf: &mut Ebpf) -> Result<(KernelMaps, MapSizes), EbpfError> {
    let services = take_map(bpf, "kl_services")?;
    let backends = take_map(bpf, "kl_backends")?;
    let members = take_map(bpf, "kl_members")?;
    let size = |d: &MapData, name: &str| {
        d.info()
            .map(|i| i.max_entries())
            .map_err(|e| EbpfError::bpf(format!("map {name}"), e))
    };
    let sizes = MapSizes {
        services: size(&services, "kl_services")?,
        backends: size(&backends, "kl_backends")?,
        members: size(&members, "kl_members")?,
    };
    Ok((KernelMaps::new(services, backends, members)?, sizes))
}

fn take_map(bpf: &mut Ebpf, name: &str) -> Result<MapData, EbpfError> {
    match bpf.take_map(name) {
        Some(Map::HashMap(d) | Map::LruHashMap(d)) => Ok(d),
        Some(_) => Err(EbpfError::bpf_msg(
            "embedded object",
            format!("map {name} has an unexpected type"),
        )),
        None => Err(EbpfError::bpf_msg(
            "embedded object",
            format!("map {name} missing"),
        )),
    }
}

fn lru<K: aya::Pod, V: aya::Pod>(
    d: MapData,
    name: &str,
) -> Result<BpfHashMap<MapData, K, V>, EbpfError> {
    BpfHashMap::try_from(Map::LruHashMap(d)).map_err(|e| EbpfError::bpf(format!("map {name}"), e))
}

/// Removes a pinned map whose shape differs from this build's (an older
/// or newer keelson's layout); its state is lost, which is logged.
fn drop_incompatible_pin(path: &Path, spec: &MapSpec) -> Result<(), EbpfError> {
    if !path.exists() {
        return Ok(());
    }
    let want = if spec.lru {
        MapType::LruHash
    } else {
        MapType::Hash
    };
    let verdict = match MapInfo::from_pin(path) {
        Ok(info) => {
            let ty = info.map_type().ok();
            if ty == Some(want)
                && info.key_size() == spec.key_size
                && info.value_size() == spec.value_size
            {
                return Ok(());
            }
            format!(
                "type {ty:?} key {} value {} (want {want:?} key {} value {})",
                info.key_size(),
                info.value_size(),
                spec.key_size,
                spec.value_size
            )
        }
        Err(e) => format!("unreadable: {e}"),
    };
    tracing::warn!(map = spec.name, path = %path.display(), found = %verdict,
        "pinned map does not match this keelson's layout; replacing it");
    std::fs::remove_file(path)
        .map_err(|e| EbpfError::io("removing an incompatible pinned map", path, e))
}

/// Detaches the programs and removes every pin keelson made (the
/// `keelson uninstall` path; also what tests call). Safe to call when
/// nothing is installed. Programs stay attached only while a running
/// keelson still holds their links open, so stop keelson first.
pub fn cleanup(config: &EbpfConfig) -> Result<(), EbpfError> {
    if pinlock::held_elsewhere(&config.pin_dir())? {
        return Err(EbpfError::io(
            "a running keelson holds the pin directory; stop it first",
            config.pin_dir(),
            std::io::Error::from(std::io::ErrorKind::WouldBlock),
        ));
    }
    remove_pins(config)
}

/// What [`cleanup`] removes, without the lock check (the running socket
/// LB removing its own pins).
fn remove_pins(config: &EbpfConfig) -> Result<(), EbpfError> {
    let links = config.links_dir();
    for (_, hook) in PROGRAMS {
        for name in [hook.to_string(), staging(hook)] {
            remove_if_present(&links.join(name))?;
        }
    }
    let maps = config.maps_dir();
    for spec in MAPS {
        remove_if_present(&maps.join(spec.name))?;
        remove_if_present(&maps.join(staging(spec.name)))?;
    }
    for dir in [links, maps, config.pin_dir()] {
        match std::fs::remove_dir(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(EbpfError::io("removing the pin directory", &dir, e));
            }
            _ => {}
        }
    }
    tracing::info!(pins = %config.pin_dir().display(), "eBPF socket LB removed");
    Ok(())
}

/// Whether a running socket LB holds the pin directory of `config` (it
/// keeps an exclusive lock on it while it runs; see `SocketLb::start`).
pub fn pins_in_use(config: &EbpfConfig) -> Result<bool, EbpfError> {
    pinlock::held_elsewhere(&config.pin_dir())
}

/// One pinned cgroup link as the kernel reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PinnedLinkInfo {
    /// The hook (`connect4`, ...), which is also the pin's file name.
    pub hook: &'static str,
    /// The kernel's link id.
    pub link_id: u32,
    /// The id of the program the link runs.
    pub program_id: u32,
}

/// The links pinned under `<bpffs_path>/links` (diagnosis: which
/// programs keelson has attached right now).
pub fn pinned_links(config: &EbpfConfig) -> Result<Vec<PinnedLinkInfo>, EbpfError> {
    let dir = config.links_dir();
    let mut out = Vec::new();
    for (_, hook) in PROGRAMS {
        let path = dir.join(hook);
        if !path.exists() {
            continue;
        }
        let link = PinnedLink::from_pin(&path).map_err(|e| {
            EbpfError::bpf(format!("opening the pinned link {}", path.display()), e)
        })?;
        let info = FdLink::from(link).info().map_err(|e| {
            EbpfError::bpf(format!("reading the pinned link {}", path.display()), e)
        })?;
        out.push(PinnedLinkInfo {
            hook,
            link_id: info.id(),
            program_id: info.program_id(),
        });
    }
    Ok(out)
}

/// The reverse translations in the pinned `kl_revnat` map: which sockets
/// the programs translated, to which backend, for which Service address
/// (diagnosis; works while keelson is stopped too).
pub fn pinned_revnat_entries(config: &EbpfConfig) -> Result<Vec<RevNatEntry>, EbpfError> {
    let path = config.maps_dir().join("kl_revnat");
    let data = MapData::from_pin(&path)
        .map_err(|e| EbpfError::bpf(format!("opening {}", path.display()), e))?;
    let map = lru::<RevNatKeyBytes, RevNatValueBytes>(data, "kl_revnat")?;
    Ok(map
        .iter()
        .filter_map(Result::ok)
        .filter_map(|(k, v)| decode_revnat(&k, &v))
        .collect())
}

/// The Service maps (`kl_services`, `kl_backends`, `kl_members`) pinned
/// under `<bpffs_path>/maps`, opened for reading what the programs use
/// (diagnosis, see [`super::inspect`]; works while keelson is stopped,
/// since the pinned links keep the programs on these maps). Nothing is
/// written through it by diagnose.
pub fn pinned_service_maps(config: &EbpfConfig) -> Result<KernelMaps, EbpfError> {
    let open = |name: &str| {
        let path = config.maps_dir().join(name);
        MapData::from_pin(&path)
            .map_err(|e| EbpfError::bpf(format!("opening {}", path.display()), e))
    };
    Ok(KernelMaps::new(
        open("kl_services")?,
        open("kl_backends")?,
        open("kl_members")?,
    )?)
}

/// Where the Service maps of `config` are pinned (for messages).
pub fn service_maps_dir(config: &EbpfConfig) -> PathBuf {
    config.maps_dir()
}

/// Ids of every BPF link that exists in the kernel now (a detached and
/// released link disappears from it).
pub fn live_link_ids() -> BTreeSet<u32> {
    aya::programs::loaded_links()
        .filter_map(Result::ok)
        .map(|info| info.id())
        .collect()
}

fn remove_if_present(path: &Path) -> Result<(), EbpfError> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(EbpfError::io("removing a pin", path, e))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_live_in_bpffs_path_and_bpffs_is_its_parent() {
        let c = EbpfConfig::default();
        assert_eq!(c.pin_dir(), PathBuf::from("/sys/fs/bpf/keelson"));
        assert_eq!(
            c.bpffs_mount_point().expect("mount point"),
            PathBuf::from("/sys/fs/bpf")
        );
        assert_eq!(c.links_dir(), PathBuf::from("/sys/fs/bpf/keelson/links"));
        for bad in ["keelson", "/"] {
            let c = EbpfConfig {
                bpffs_path: PathBuf::from(bad),
                ..EbpfConfig::default()
            };
            assert!(c.bpffs_mount_point().is_err(), "{bad}");
        }
    }
}

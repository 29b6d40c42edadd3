//! The mount table as `/proc/<pid>/mountinfo` shows it (`proc(5)`): one
//! parser for the volume manager (what is mounted under a pod) and the
//! cgroup layout detection (where the hierarchies are).

use std::path::PathBuf;

/// One entry of the mount table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountPoint {
    /// Where it is mounted.
    pub path: PathBuf,
    /// Filesystem type (`tmpfs`, `hugetlbfs`, `ext4`…).
    pub fstype: String,
    /// Mount source.
    pub source: String,
    /// Superblock options (`rw,size=65536k`).
    pub options: String,
}

/// Parses `/proc/<pid>/mountinfo`. Lines that do not parse are skipped.
pub fn parse_mountinfo(text: &str) -> Vec<MountPoint> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<MountPoint> {
    // id parent major:minor root mountpoint options [optional...] - fstype source superoptions
    let (left, right) = line.split_once(" - ")?;
    let mut l = left.split(' ');
    let mountpoint = l.nth(4)?;
    let mut r = right.split(' ');
    let fstype = r.next()?;
    let source = r.next().unwrap_or("");
    let options = r.next().unwrap_or("");
    Some(MountPoint {
        path: PathBuf::from(unescape(mountpoint)),
        fstype: unescape(fstype),
        source: unescape(source),
        options: unescape(options),
    })
}

/// Undoes the kernel's octal escapes (`\040` space, `\011` tab, `\012`
/// newline, `\134` backslash); anything else stays as written.
fn unescape(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && let Some(oct) = bytes.get(i + 1..i + 4)
            && let Ok(text) = std::str::from_utf8(oct)
            && let Ok(v) = u8::from_str_radix(text, 8)
        {
            out.push(v);
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
22 1 0:21 / /proc rw,nosuid shared:12 - proc proc rw
90 30 0:50 / /var/lib/keelson/pods/u1/volumes/kubernetes.io~secret/a\\040b rw,relatime - tmpfs tmpfs rw,size=1024k
91 30 8:1 /data/x /var/lib/keelson/pods/u1/volume-subpaths/cfg/app/0 rw - ext4 /dev/sda1 rw
35 25 0:30 / /sys/fs/cgroup/memory rw,nosuid shared:14 - cgroup cgroup rw,memory
garbage line
";

    #[test]
    fn parses_and_unescapes() {
        let m = parse_mountinfo(SAMPLE);
        assert_eq!(m.len(), 4);
        assert_eq!(
            m[1].path,
            PathBuf::from("/var/lib/keelson/pods/u1/volumes/kubernetes.io~secret/a b")
        );
        assert_eq!(m[1].fstype, "tmpfs");
        assert_eq!(m[1].options, "rw,size=1024k");
        assert_eq!(m[2].source, "/dev/sda1");
        assert_eq!(m[3].fstype, "cgroup");
        assert_eq!(m[3].options, "rw,memory");
    }

    #[test]
    fn unescapes_octal_and_keeps_other_backslashes() {
        assert_eq!(unescape("a\\011b\\012c\\134d"), "a\tb\nc\\d");
        assert_eq!(unescape("x\\9y\\"), "x\\9y\\");
    }
}

//! Canonical text of resource quantities, as apimachinery prints them, so
//! the capacity and allocatable keelson reports read exactly like kubelet's
//! (`cpu: "2"`, `memory: 24574176Ki`, `pods: "110"`, `ephemeral-storage:
//! "226881364554"`, `hugepages-2Mi: "0"`).
//!
//! Two formats matter for a node: DecimalSI (cpu, pods) and BinarySI
//! (memory, ephemeral-storage, hugepages). Arithmetic keeps the format of
//! the left operand, as `Quantity.Sub` does upstream.

use keelson_common::quantity::Quantity;

/// How a quantity is printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Powers of 1000 (`500m`, `2`, `1k`).
    DecimalSi,
    /// Powers of 1024 for whole numbers (`1Ki`, `24574176Ki`); fractions fall
    /// back to DecimalSI, as upstream.
    BinarySi,
}

/// The format kubelet uses for a node resource name.
pub fn format_of(resource: &str) -> Format {
    if resource == "memory"
        || resource == "ephemeral-storage"
        || resource.starts_with("hugepages-")
        || resource == "storage"
    {
        Format::BinarySi
    } else {
        Format::DecimalSi
    }
}

/// Prints `q` in `format`'s canonical form.
pub fn canonical(q: Quantity, format: Format) -> String {
    let milli = q.milli_value();
    if milli == 0 {
        return "0".to_string();
    }
    match format {
        Format::BinarySi if milli % 1000 == 0 => binary(milli / 1000),
        _ => decimal(milli),
    }
}

fn binary(units: i128) -> String {
    const SUFFIXES: [&str; 7] = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    let negative = units < 0;
    let mut n = units.unsigned_abs();
    let mut i = 0;
    while i + 1 < SUFFIXES.len() && n >= 1024 && n.is_multiple_of(1024) {
        n /= 1024;
        i += 1;
    }
    format!("{}{n}{}", if negative { "-" } else { "" }, SUFFIXES[i])
}

fn decimal(milli: i128) -> String {
    // exponent (in powers of 1000) relative to milli-units: 0 → "m", 1 → "", 2 → "k", ...
    const SUFFIXES: [&str; 8] = ["m", "", "k", "M", "G", "T", "P", "E"];
    let negative = milli < 0;
    let mut n = milli.unsigned_abs();
    let mut i = 0;
    while i + 1 < SUFFIXES.len() && n.is_multiple_of(1000) {
        n /= 1000;
        i += 1;
    }
    format!("{}{n}{}", if negative { "-" } else { "" }, SUFFIXES[i])
}

/// Parses the text of an API quantity; `None` when it is not a quantity.
pub fn parse(q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity) -> Option<Quantity> {
    Quantity::parse(&q.0).ok()
}

/// An API quantity with canonical text for `resource`.
pub fn api_quantity(
    resource: &str,
    q: Quantity,
) -> k8s_openapi::apimachinery::pkg::api::resource::Quantity {
    k8s_openapi::apimachinery::pkg::api::resource::Quantity(canonical(q, format_of(resource)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prints_like_apimachinery() {
        let cases: &[(Quantity, Format, &str)] = &[
            (Quantity::from_units(2), Format::DecimalSi, "2"),
            (Quantity::from_milli(1900), Format::DecimalSi, "1900m"),
            (Quantity::from_units(110), Format::DecimalSi, "110"),
            (Quantity::from_units(1000), Format::DecimalSi, "1k"),
            (Quantity::from_units(0), Format::BinarySi, "0"),
            (
                Quantity::from_units(25_163_956_224),
                Format::BinarySi,
                "24574176Ki",
            ),
            (
                Quantity::from_units(1024 * 1024 * 1024),
                Format::BinarySi,
                "1Gi",
            ),
            (
                Quantity::from_units(226_881_364_554),
                Format::BinarySi,
                "226881364554",
            ),
            (Quantity::from_units(1000), Format::BinarySi, "1000"),
            (Quantity::from_milli(1500), Format::BinarySi, "1500m"),
        ];
        for (q, f, want) in cases {
            assert_eq!(canonical(*q, *f), *want, "{q:?} {f:?}");
        }
    }

    #[test]
    fn formats_by_resource() {
        assert_eq!(format_of("memory"), Format::BinarySi);
        assert_eq!(format_of("hugepages-2Mi"), Format::BinarySi);
        assert_eq!(format_of("cpu"), Format::DecimalSi);
        assert_eq!(format_of("pods"), Format::DecimalSi);
    }
}

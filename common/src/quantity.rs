//! Kubernetes resource quantities (`100Mi`, `1.5`, `500m`, `2Gi`, `1e3`).
//!
//! Values are kept as an exact count of thousandths ("milli-units"), which
//! is enough for every resource a node agent computes with: CPU in
//! millicores, memory and storage in bytes, counts of pids and pods.

use std::fmt;

/// A parsed quantity, exact to a thousandth of a unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Quantity {
    milli: i128,
}

/// Why a quantity string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid quantity {text:?}: {reason}")]
pub struct QuantityError {
    /// The input.
    pub text: String,
    /// What was wrong.
    pub reason: &'static str,
}

impl Quantity {
    /// Zero.
    pub const ZERO: Quantity = Quantity { milli: 0 };

    /// A quantity of `v` whole units.
    pub const fn from_units(v: i64) -> Self {
        Quantity {
            milli: v as i128 * 1000,
        }
    }

    /// A quantity of `m` thousandths (millicores for CPU).
    pub const fn from_milli(m: i64) -> Self {
        Quantity { milli: m as i128 }
    }

    /// Parses the Kubernetes quantity syntax: a signed decimal number followed
    /// by a binary suffix (Ki Mi Gi Ti Pi Ei), a decimal suffix (n u m k M G T P E)
    /// or a decimal exponent (e3, E-2).
    pub fn parse(text: &str) -> Result<Self, QuantityError> {
        let err = |reason| QuantityError {
            text: text.to_string(),
            reason,
        };
        let t = text.trim();
        if t.is_empty() {
            return Err(err("empty"));
        }
        let (negative, body) = match t.as_bytes()[0] {
            b'-' => (true, &t[1..]),
            b'+' => (false, &t[1..]),
            _ => (false, t),
        };
        let num_end = body
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(body.len());
        let (num, suffix) = body.split_at(num_end);
        if num.is_empty() || num == "." {
            return Err(err("missing number"));
        }
        let (int_part, frac_part) = num.split_once('.').unwrap_or((num, ""));
        if frac_part.contains('.') {
            return Err(err("more than one decimal point"));
        }
        // mantissa as an integer with `scale` decimal digits after the point
        let digits = format!("{int_part}{frac_part}");
        let mantissa: i128 = digits.parse().map_err(|_| err("number too large"))?;
        let scale = frac_part.len() as i32;

        // multiplier = base^exp (binary) or 10^exp10 (decimal)
        let (binary_shift, exp10): (u32, i32) = match suffix {
            "" => (0, 0),
            "Ki" => (10, 0),
            "Mi" => (20, 0),
            "Gi" => (30, 0),
            "Ti" => (40, 0),
            "Pi" => (50, 0),
            "Ei" => (60, 0),
            "n" => (0, -9),
            "u" => (0, -6),
            "m" => (0, -3),
            "k" => (0, 3),
            "M" => (0, 6),
            "G" => (0, 9),
            "T" => (0, 12),
            "P" => (0, 15),
            "E" => (0, 18),
            s if s.starts_with('e') || s.starts_with('E') => {
                let e: i32 = s[1..].parse().map_err(|_| err("bad exponent"))?;
                (0, e)
            }
            _ => return Err(err("unknown suffix")),
        };
        // milli = mantissa * 2^shift * 10^(exp10 + 3 - scale), rounded up (as upstream rounds up)
        let mut value = mantissa
            .checked_mul(1i128 << binary_shift)
            .ok_or_else(|| err("number too large"))?;
        let pow = exp10 + 3 - scale;
        if pow >= 0 {
            let p = 10i128
                .checked_pow(pow as u32)
                .ok_or_else(|| err("number too large"))?;
            value = value
                .checked_mul(p)
                .ok_or_else(|| err("number too large"))?;
        } else {
            let p = 10i128
                .checked_pow((-pow) as u32)
                .ok_or_else(|| err("number too small"))?;
            value = (value + p - 1) / p;
        }
        Ok(Quantity {
            milli: if negative { -value } else { value },
        })
    }

    /// Thousandths of a unit (millicores for CPU).
    pub fn milli_value(self) -> i128 {
        self.milli
    }

    /// Whole units, rounded up like upstream's `Quantity.Value()`.
    pub fn value(self) -> i128 {
        if self.milli >= 0 {
            (self.milli + 999) / 1000
        } else {
            self.milli / 1000
        }
    }

    /// Whole units as u64, clamped at 0 for negative values.
    pub fn value_u64(self) -> u64 {
        u64::try_from(self.value().max(0)).unwrap_or(u64::MAX)
    }

    /// True when negative.
    pub fn is_negative(self) -> bool {
        self.milli < 0
    }

    /// Sum.
    pub fn saturating_add(self, other: Quantity) -> Quantity {
        Quantity {
            milli: self.milli.saturating_add(other.milli),
        }
    }

    /// Difference.
    pub fn saturating_sub(self, other: Quantity) -> Quantity {
        Quantity {
            milli: self.milli.saturating_sub(other.milli),
        }
    }

    /// Canonical text for a CPU amount: whole cores when exact, else millicores.
    pub fn to_cpu_string(self) -> String {
        if self.milli % 1000 == 0 {
            (self.milli / 1000).to_string()
        } else {
            format!("{}m", self.milli)
        }
    }

    /// Canonical text for a byte count: the largest exact binary suffix
    /// (`Ki` multiples as upstream prints memory capacity), else plain bytes.
    pub fn to_bytes_string(self) -> String {
        let v = self.value();
        if v != 0 && v % 1024 == 0 {
            let mut n = v;
            let mut i = 0;
            let suffixes = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
            while n % 1024 == 0 && i < suffixes.len() - 1 {
                n /= 1024;
                i += 1;
            }
            format!("{n}{}", suffixes[i])
        } else {
            v.to_string()
        }
    }
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.milli % 1000 == 0 {
            write!(f, "{}", self.milli / 1000)
        } else {
            write!(f, "{}m", self.milli)
        }
    }
}

/// Parses a `k8s_openapi` quantity, naming the resource in the error.
pub fn parse_k8s(
    q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity,
) -> Result<Quantity, QuantityError> {
    Quantity::parse(&q.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_upstream_forms() {
        let cases: &[(&str, i128)] = &[
            ("1", 1000),
            ("500m", 500),
            ("0.5", 500),
            ("1.5", 1500),
            ("100Mi", 100 * 1024 * 1024 * 1000),
            ("1Gi", 1024 * 1024 * 1024 * 1000),
            ("2k", 2_000_000),
            ("1e3", 1_000_000),
            ("1E-3", 1),
            ("1n", 1), // rounds up to one thousandth
            ("-2", -2000),
            ("0", 0),
        ];
        for (text, milli) in cases {
            assert_eq!(
                Quantity::parse(text).map(|q| q.milli_value()),
                Ok(*milli),
                "{text}"
            );
        }
    }

    #[test]
    fn refuses_garbage() {
        for text in ["", "Mi", "1.2.3", "10Xi", "abc", "1e"] {
            assert!(Quantity::parse(text).is_err(), "{text:?}");
        }
    }

    #[test]
    fn value_rounds_up() {
        assert_eq!(Quantity::parse("1500m").map(Quantity::value), Ok(2));
        assert_eq!(
            Quantity::parse("100Mi").map(Quantity::value),
            Ok(104_857_600)
        );
    }

    #[test]
    fn formats() {
        assert_eq!(Quantity::from_milli(1500).to_cpu_string(), "1500m");
        assert_eq!(Quantity::from_units(4).to_cpu_string(), "4");
        assert_eq!(
            Quantity::from_units(2 * 1024 * 1024).to_bytes_string(),
            "2Mi"
        );
        assert_eq!(Quantity::from_units(1000).to_bytes_string(), "1000");
    }
}

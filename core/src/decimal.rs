//! Fixed-point decimals for explanations: [`Fixed`] writes what `{:.N}`
//! writes, without the standard library's exact float formatting
//! (Grisu with a bignum Dragon fallback), which was a quarter of the
//! SLO-aware router's decision on a node's routing thread: every decision
//! writes its predictions, SLO and costs into the explanation each reply
//! carries. Core writes the decimals of what it explains per decision or
//! per check through it, [`crate::time`]'s instants and durations
//! included.
//!
//! The fast path scales by `10^N` in floating point and rounds. That
//! product is off the exact one by at most half an ulp, so it rounds the
//! same way whenever its fraction is further than that from one half; a
//! value that close to a tie, a value too large for the scaled integer to
//! be exact, and anything not finite go to the standard formatter.
//!
//! # Properties
//!
//! - (A) `Fixed::<N>(x)` displays exactly as `format!("{x:.N}")` does, for
//!   every `f64` and `N` up to [`DECIMALS_MAX`], with the formatter's
//!   width, fill and alignment, and with its `+` flag as `{x:+.N}` does.
//! - (B) [`Change`]`::<N>(x)`, a change an explanation reports, displays as
//!   `{x:+.N}` does, except that a change that rounds to zero reads `+0…`,
//!   never `-0…` (a placement's expected violations can come out a hair
//!   below zero).

use std::fmt;

/// The most decimals [`Fixed`] takes.
pub const DECIMALS_MAX: u32 = 6;

const POWERS_OF_TEN: [u64; DECIMALS_MAX as usize + 1] = [1, 10, 100, 1_000, 10_000, 100_000, 1_000_000];

/// Below this a scaled value's integer part is exact in an `f64` with
/// room to spare (2⁵³ ≈ 9.007 × 10¹⁵).
const SCALED_MAX: f64 = 1e15;

/// `x` with `DECIMALS` decimals, displayed as `{:.DECIMALS}` displays it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fixed<const DECIMALS: u32>(pub f64);

impl<const DECIMALS: u32> fmt::Display for Fixed<DECIMALS> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_fixed::<DECIMALS>(self.0, f.sign_plus(), f)
    }
}

/// A change `x` with `DECIMALS` decimals and its sign always written; one
/// that rounds to zero is written as zero, `+0.00`, not `-0.00`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Change<const DECIMALS: u32>(pub f64);

impl<const DECIMALS: u32> fmt::Display for Change<DECIMALS> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rounds_to_zero = self.0.abs() * (POWERS_OF_TEN[DECIMALS as usize] as f64) < 0.5;
        write_fixed::<DECIMALS>(if rounds_to_zero { 0.0 } else { self.0 }, true, f)
    }
}

/// Writes `x` as `{x:.DECIMALS}` does, or `{x:+.DECIMALS}` with
/// `sign_plus`, padded by `f`'s width, fill and alignment.
fn write_fixed<const DECIMALS: u32>(x: f64, sign_plus: bool, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    const { assert!(DECIMALS <= DECIMALS_MAX, "Fixed takes at most DECIMALS_MAX decimals") };
    let power = POWERS_OF_TEN[DECIMALS as usize];
    let scaled = x.abs() * power as f64;
    // Not finite, too large, or too near a tie for the product's
    // rounding (half an ulp of it) to be sure of the digit.
    let fraction = scaled - scaled.trunc();
    let in_range = scaled.is_finite() && scaled < SCALED_MAX;
    if !in_range || (fraction - 0.5).abs() <= scaled * f64::EPSILON {
        let text = if sign_plus { format!("{x:+.prec$}", prec = DECIMALS as usize) } else { format!("{x:.prec$}", prec = DECIMALS as usize) };
        return f.pad(&text);
    }
    let units = scaled.round() as u64;
    // Sign, up to 16 integer digits, the point and the decimals.
    let mut text = [0u8; 1 + 16 + 1 + DECIMALS_MAX as usize];
    let mut end = text.len();
    let mut put = |byte: u8| {
        end -= 1;
        text[end] = byte;
    };
    let (mut whole, mut decimals) = (units / power, units % power);
    for _ in 0..DECIMALS {
        put(b'0' + (decimals % 10) as u8);
        decimals /= 10;
    }
    if DECIMALS > 0 {
        put(b'.');
    }
    loop {
        put(b'0' + (whole % 10) as u8);
        whole /= 10;
        if whole == 0 {
            break;
        }
    }
    if x.is_sign_negative() {
        put(b'-');
    } else if sign_plus {
        put(b'+');
    }
    f.pad(std::str::from_utf8(&text[end..]).expect("digits, a point and a sign are ASCII"))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn agrees(x: f64) -> Result<(), TestCaseError> {
        // (A) Each width the explanations use, and the rest up to the most.
        prop_assert_eq!(Fixed::<0>(x).to_string(), format!("{x:.0}"), "{:e}", x);
        prop_assert_eq!(Fixed::<1>(x).to_string(), format!("{x:.1}"), "{:e}", x);
        prop_assert_eq!(Fixed::<2>(x).to_string(), format!("{x:.2}"), "{:e}", x);
        prop_assert_eq!(Fixed::<3>(x).to_string(), format!("{x:.3}"), "{:e}", x);
        prop_assert_eq!(Fixed::<4>(x).to_string(), format!("{x:.4}"), "{:e}", x);
        prop_assert_eq!(Fixed::<6>(x).to_string(), format!("{x:.6}"), "{:e}", x);
        // The sign flag.
        prop_assert_eq!(format!("{:+}", Fixed::<2>(x)), format!("{x:+.2}"), "{:e}", x);
        prop_assert_eq!(format!("{:+}", Fixed::<4>(x)), format!("{x:+.4}"), "{:e}", x);
        // (B) A change: the sign flag's text, with no negative zero.
        let change = |text: String| if text.starts_with("-0.") && text[3..].bytes().all(|b| b == b'0') { text.replacen('-', "+", 1) } else { text };
        prop_assert_eq!(Change::<2>(x).to_string(), change(format!("{x:+.2}")), "{:e}", x);
        prop_assert_eq!(Change::<4>(x).to_string(), change(format!("{x:+.4}")), "{:e}", x);
        Ok(())
    }

    #[test]
    fn ties_signed_zeros_and_the_edges_display_as_the_standard_formatter_does() {
        for x in [
            0.0, -0.0, 0.05, 0.15, 0.25, 0.35, 2.5, 3.5, -2.5, 0.125, 1.0005, 0.00005, 0.04, -0.04, 9.95, 99.95, 999_999.95, 1e14, 1e15, 1e16, 9.9e15,
            f64::MAX, f64::MIN_POSITIVE, 5e-324, f64::NAN, f64::INFINITY, f64::NEG_INFINITY,
        ] {
            agrees(x).unwrap();
        }
        assert_eq!(format!("[{:>8}]", Fixed::<1>(2.71)), "[     2.7]", "the formatter's width and alignment apply");
        assert_eq!(format!("{:+} {:+} {:+}", Fixed::<2>(0.25), Fixed::<2>(-0.05), Fixed::<2>(0.0)), "+0.25 -0.05 +0.00", "the sign flag applies");
        assert_eq!(format!("{} {} {} {}", Change::<2>(0.25), Change::<2>(-0.05), Change::<2>(-0.004), Change::<2>(-0.0)), "+0.25 -0.05 +0.00 +0.00", "a change that rounds to zero reads +0.00");
        // (B) At the edge of rounding to zero, both sides of -0.005.
        for x in [-0.005, f64::from_bits((-0.005f64).to_bits() - 1), f64::from_bits((-0.005f64).to_bits() + 1), -0.00005, f64::from_bits((-0.00005f64).to_bits() - 1)] {
            let standard = format!("{x:+.2}");
            assert_eq!(Change::<2>(x).to_string(), if standard == "-0.00" { "+0.00".to_owned() } else { standard }, "{x:e}");
            let standard = format!("{x:+.4}");
            assert_eq!(Change::<4>(x).to_string(), if standard == "-0.0000" { "+0.0000".to_owned() } else { standard }, "{x:e}");
        }
    }

    proptest! {
        #[test]
        fn any_double_displays_as_the_standard_formatter_displays_it(bits in any::<u64>()) {
            agrees(f64::from_bits(bits))?;
        }

        #[test]
        fn values_in_the_range_explanations_carry_display_as_the_standard_formatter_displays_them(
            x in -1e7f64..1e7,
            hundredths in -100_000_000i64..100_000_000,
        ) {
            agrees(x)?;
            // Decimal-looking values, the nearest a tie can come.
            agrees(hundredths as f64 / 100.0)?;
            agrees(hundredths as f64 / 1000.0 + 0.0005)?;
        }
    }
}

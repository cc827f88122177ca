//! Trace lines fuzzed (issue 8, "bad kernel input"): whatever trace_pipe hands the catcher —
//! arbitrary text, real captures with bytes cut, inserted or swapped, near-misses of every event —
//! no parser panics, a line the catcher does not understand is kept verbatim (so the error names the
//! input), and every well-formed `mm_page_alloc` line round-trips.

use std::path::PathBuf;

use fraglab_probe::tracefs::{
    parse_alloc_line, parse_alloc_payload, parse_extfrag_payload, parse_trace_line, GfpTable, TraceParser,
};
use proptest::prelude::*;

fn capture(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/captures/tracefs").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every trace line of the captures, event lines and stack frames alike.
fn real_lines() -> Vec<String> {
    ["host-6.18-order3-unix-send.trace", "host-6.18-order2-pipe-resize.trace", "host-6.18-extfrag.trace"]
        .iter()
        .flat_map(|f| capture(f).lines().map(str::to_string).collect::<Vec<_>>())
        .collect()
}

/// Every parser a trace line can reach, and the streaming parser on the line and its neighbours.
fn parse_everything(line: &str) {
    let _ = parse_trace_line(line);
    let _ = parse_alloc_line(line);
    let _ = parse_alloc_payload(line);
    let _ = parse_extfrag_payload(line);
    if let Ok((_, _, payload)) = parse_trace_line(line) {
        let _ = parse_alloc_payload(payload);
        let _ = parse_extfrag_payload(payload);
    }
    let mut p =
        TraceParser::new(true, GfpTable::from_format(&capture("host-6.18-mm_page_alloc.format")).ok());
    p.feed_line(line);
    p.feed_line(" => frame");
    p.feed_line(line);
    p.end_of_read();
    let _ = p.take_ready(false);
    let _ = p.take_ready(true);
}

/// A real line with one edit: a range cut, text inserted, or the line truncated (on char bounds).
fn mutated() -> impl Strategy<Value = String> {
    (
        prop::sample::select(real_lines()),
        0usize..4,
        any::<prop::sample::Index>(),
        any::<prop::sample::Index>(),
        "\\PC{0,12}",
    )
        .prop_map(|(line, how, a, b, text)| {
            let bounds: Vec<usize> = line.char_indices().map(|(i, _)| i).chain([line.len()]).collect();
            let (mut x, mut y) = (*a.get(&bounds), *b.get(&bounds));
            if x > y {
                std::mem::swap(&mut x, &mut y);
            }
            match how {
                0 => format!("{}{}", &line[..x], &line[y..]),
                1 => format!("{}{text}{}", &line[..x], &line[x..]),
                2 => line[..x].to_string(),
                _ => format!("{}{text}{}", &line[..x], &line[y..]),
            }
        })
}

proptest! {
    #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn no_line_panics(line in "\\PC{0,300}") {
        parse_everything(&line);
    }

    #[test]
    fn no_mutated_real_line_panics(line in mutated()) {
        parse_everything(&line);
    }

    #[test]
    fn no_near_miss_panics(
        head in prop::sample::select(vec![
            "", "x-1 [000] ", "x-1 [000] .....", "  python3-4567    [001] .....  1717.479162: ", "x-y [0] 1.5: ",
            "x-1 [99999999999] 1.5: ", "x-99999999999 [0] 1.5: ", "x-1 (1) [0] 1.5: ", "[ 1.5: ", "a-1 [0] 1.: ", "a-1 [0] .5: ",
        ]),
        event in prop::sample::select(vec![
            "mm_page_alloc: ", "mm_page_alloc_extfrag: ", "<stack trace>", "mm_page_free: ", "", "mm_page_alloc:",
        ]),
        fields in prop::collection::vec(prop::sample::select(vec![
            "page=", "page=0000000000000000", "page=(null)", "(null)", "pfn=", "pfn=0x", "pfn=0xffffffffffffffffff", "pfn=-1",
            "pfn=18446744073709551615", "order=", "order=-1", "order=99999999999", "migratetype=", "migratetype=x",
            "gfp_flags=", "gfp_flags=none", "gfp_flags=|", "gfp_flags=0x", "gfp_flags=GFP_KERNEL|0xzz", "alloc_order=2",
            "fallback_order=99999999999", "alloc_migratetype=-99999999999", "fragmenting=1", "change_ownership=",
            "=", "==", "x=y=z",
        ]), 0..10),
    ) {
        parse_everything(&format!("{head}{event}{}", fields.join(" ")));
    }

    /// A line the catcher does not understand is counted and kept as it was read: the error names it.
    #[test]
    fn unparsed_lines_are_kept_verbatim(line in "[^ =>\\s][\\PC]{0,80}") {
        let understood = matches!(
            parse_trace_line(&line),
            Ok((_, "mm_page_alloc" | "<stack trace>", _))
        ) && (parse_alloc_line(&line).is_ok() || parse_trace_line(&line).is_ok_and(|(_, n, _)| n == "<stack trace>"));
        let extfrag = parse_trace_line(&line)
            .is_ok_and(|(_, n, p)| n == "mm_page_alloc_extfrag" && parse_extfrag_payload(p).is_ok());
        let lost = line.trim().starts_with("CPU:") && line.contains("[LOST ");
        prop_assume!(!understood && !extfrag && !lost && !line.trim().is_empty());
        let mut p = TraceParser::new(false, None);
        p.feed_line(&line);
        prop_assert_eq!(p.unparsed_count, 1);
        prop_assert_eq!(&p.unparsed, &vec![line.clone()]);
        prop_assert!(p.take_ready(true).is_empty());
    }

    /// Well-formed `mm_page_alloc` lines in the kernel's layout give back exactly what was written.
    #[test]
    fn alloc_lines_round_trip(
        comm in "[a-zA-Z0-9_./:-]{1,15}",
        pid in 1i32..4_194_304,
        cpu in 0u32..512,
        secs in 0u64..10_000_000,
        usec in 0u32..1_000_000,
        failed in any::<bool>(),
        pfn in 1u64..(1 << 40),
        page in 1u64..u64::MAX,
        order in 0u32..11,
        migratetype in 0i32..6,
        names in prop::collection::vec("__?GFP_[A-Z_]{1,12}", 0..5),
        residue in prop::option::of(1u64..(1 << 30)),
        flags in prop::sample::select(vec![".....", "d..1.", "...s1", ""]),
    ) {
        let mut gfp: Vec<String> = names.clone();
        gfp.extend(residue.map(|r| format!("0x{r:x}")));
        let gfp = if gfp.is_empty() { "none".to_string() } else { gfp.join("|") };
        let (page_text, pfn_value) = if failed { ("0000000000000000".to_string(), 0) } else { (format!("{page:016x}"), pfn) };
        let ts = format!("{secs:5}.{usec:06}");
        let line = format!(
            "{comm:>16}-{pid:<7} [{cpu:03}] {flags} {ts}: mm_page_alloc: page={page_text} pfn=0x{pfn_value:x} order={order} migratetype={migratetype} gfp_flags={gfp}"
        );
        let e = parse_alloc_line(&line).map_err(|err| TestCaseError::fail(format!("{line}: {err}")))?;
        prop_assert_eq!(&e.comm, &comm);
        prop_assert_eq!((e.pid, e.cpu, e.order, e.migratetype), (pid, cpu, order, migratetype));
        prop_assert_eq!(e.time, ts.trim().parse::<f64>().unwrap());
        prop_assert_eq!(e.failed, failed);
        prop_assert_eq!(e.pfn, (!failed).then_some(pfn));
        prop_assert_eq!(&e.gfp_flags, &names);
        prop_assert_eq!(e.gfp_residue, residue);
        prop_assert_eq!(&e.line, &line);
    }

    #[test]
    fn no_format_file_panics(text in "\\PC{0,400}", cut in any::<prop::sample::Index>()) {
        let _ = GfpTable::from_format(&text);
        let real = capture("host-6.18-mm_page_alloc.format");
        let bounds: Vec<usize> = real.char_indices().map(|(i, _)| i).collect();
        let at = *cut.get(&bounds);
        let _ = GfpTable::from_format(&real[..at]);
        let _ = GfpTable::from_format(&format!("{}{text}{}", &real[..at], &real[at..]));
    }
}

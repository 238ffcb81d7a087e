//! A file or request body of documents (text; invalid UTF-8 replaced):
//! `hardware::parse_documents`, then for each document
//! `bmc::model::parse` and `hardware::validate`, and for every valid
//! Hardware the typed view the inventory keeps of it.
//!
//! Checked besides "no panic": the start-up path (`Machine::from_doc` on
//! the stored text) gives the very view that validation made, details
//! included, and the snapshot finds the machine by each of its MACs.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tinkerbox::bmc::model::{self, Doc};
use tinkerbox::hardware::{self, Machine};
use tinkerbox::inventory::Snapshot;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let Ok(docs) = hardware::parse_documents(&text) else {
        return;
    };
    for doc in docs {
        match model::parse(doc.clone()) {
            Ok(Doc::Job { spec, .. }) => {
                for t in &spec.tasks {
                    let _ = t.describe();
                    let _ = t.boot();
                }
            }
            Ok(Doc::Task { action, .. }) => {
                let _ = action.describe();
            }
            Ok(_) | Err(_) => {}
        }
        let Ok(hw) = hardware::validate(doc) else {
            continue;
        };
        let m = &hw.machine;
        let stored = serde_json::to_string(&hw.doc).unwrap_or_default();
        match Machine::from_doc(m.key.clone(), &stored) {
            Ok(again) => {
                assert_eq!(&again, m, "from_doc({stored}) differs");
                assert_eq!(again.details(), m.details());
            }
            Err(e) => panic!("a validated document does not load: {e}: {stored}"),
        }
        let snap = Snapshot::build([m.clone()]);
        for mac in m.macs() {
            let (found, iface) = snap.by_mac(&mac).expect("found by its MAC");
            assert_eq!(found.key, m.key);
            assert_eq!(iface.mac, Some(mac));
        }
    }
});

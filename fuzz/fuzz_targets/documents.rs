//! A file or request body of documents (text; invalid UTF-8 replaced):
//! `hardware::parse_documents`, then for each document
//! `bmc::model::parse` and `hardware::validate`, and for every valid
//! Hardware the inventory's compact record of it.
//!
//! Checked besides "no panic": the record keeps a machine whole (the
//! packing is documented as lossless): `Record::from(&machine).machine()`,
//! and the start-up path `Record::from_stored` on the stored document,
//! both give back the validated machine, and `dhcp_machine()` its
//! interfaces.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tinkerbox::bmc::model::{self, Doc};
use tinkerbox::hardware::{self, Record};

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
        let packed = Record::from(m);
        assert_eq!(
            &packed.machine(),
            m,
            "Record::from(&machine) lost something"
        );
        assert_eq!(packed.macs().collect::<Vec<_>>(), m.macs);
        assert_eq!(packed.ips().collect::<Vec<_>>(), m.ips);
        assert_eq!(packed.dhcp_machine().spec.interfaces, m.spec.interfaces);
        assert_eq!(packed.bmc_ref(), m.spec.bmc_ref);
        let stored = serde_json::to_string(&hw.doc).unwrap_or_default();
        match Record::from_stored(m.key.clone(), &stored) {
            Ok(r) => assert_eq!(&r.machine(), m, "from_stored({stored}) differs"),
            Err(e) => panic!("a validated document does not load: {e}: {stored}"),
        }
    }
});

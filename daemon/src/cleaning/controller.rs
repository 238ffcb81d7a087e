//! The tokio shell around [`super::decide`]: every few seconds (and at
//! each Hardware write) the Hardware that CAPT claimed or that has a
//! cleaning phase are read, each one's step decided and carried out
//! through the services. It runs where the engines run (on the leader).

use super::{Run, Step};
use crate::clock::now_ms;
use crate::hardware::Key;
use crate::kinds::Kind;
use crate::services::Services;
use crate::store::Store;
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;

/// How often the claimed and held Hardware are looked at. A pass is one
/// indexed-free SQLite scan that parses only those documents.
const PASS_EVERY: Duration = Duration::from_secs(3);

pub struct Controller {
    store: Store,
    services: Arc<Services>,
}

impl Controller {
    pub fn new(store: Store, services: Arc<Services>) -> Self {
        Controller { store, services }
    }

    pub async fn run(self) {
        loop {
            match self
                .store
                .list_labelled(super::OWNER_NAME, super::PHASE)
                .await
            {
                Ok(docs) => {
                    for doc in docs {
                        let key = Key::of(&doc);
                        if let Err(e) = self.one(&key, &doc).await {
                            tracing::warn!(hardware = %key, error = %e, "cleaning: pass failed; the next one retries");
                        }
                    }
                }
                Err(e) => tracing::warn!(error = %e, "cleaning: cannot list Hardware"),
            }
            tokio::time::sleep(PASS_EVERY).await;
        }
    }

    async fn one(&self, key: &Key, doc: &Value) -> Result<(), crate::services::Error> {
        // A BareMetalHost's Hardware is cleaned by its host.
        if doc
            .pointer("/metadata/labels")
            .and_then(|l| l.get(crate::metal3::OWNER_LABEL))
            .is_some()
        {
            return Ok(());
        }
        let seen = super::seen(doc);
        let run = match (&seen.owner, seen.phase, &seen.run) {
            (super::Owner::Holder, Some(super::Phase::Cleaning), Some(r)) => {
                self.workflow(key, r).await?
            }
            _ => Run::None,
        };
        let worker = super::worker(doc);
        let step = super::decide(&seen, &run, worker.clone().map(drop));
        if step == Step::Nothing {
            return Ok(());
        }
        let new_run = now_ms().to_string();
        let hw = &self.services.hardware;
        match &step {
            Step::Start => {
                if let (Ok(w), Some(r)) = (&worker, &seen.run) {
                    self.start(key, doc, w, r).await?;
                }
            }
            Step::Hold => {
                hw.cleaning_step(key, &seen, &step, &new_run).await?;
                if let Ok(w) = &worker {
                    self.start(key, doc, w, &new_run).await?;
                }
            }
            Step::Mark | Step::Finish | Step::Unmark(_) => {
                hw.cleaning_step(key, &seen, &step, &new_run).await?;
                self.remove_operation(key).await?;
            }
            Step::Fail(_) => hw.cleaning_step(key, &seen, &step, &new_run).await?,
            Step::Nothing => {}
        }
        Ok(())
    }

    /// Run `run`'s Workflow: an earlier run's deleted first (the engine
    /// runs a Workflow once), then the Template and this one made.
    async fn start(
        &self,
        key: &Key,
        doc: &Value,
        worker: &str,
        run: &str,
    ) -> Result<(), crate::services::Error> {
        let k = super::key(key);
        // An object of the name that is not a cleaning is the user's:
        // never overwritten (the pass fails, saying so, until it goes).
        for existing in [
            self.store.template(&k).await?,
            self.store.workflow(&k).await?.map(|w| w.doc),
        ]
        .into_iter()
        .flatten()
        {
            if !super::ours(&existing) {
                return Err(crate::services::Error::Invalid(
                    crate::hardware::FieldError::new(
                        "metadata.name",
                        format!(
                            "{k} exists and is not a release cleaning: it is left alone, and {key} stays held"
                        ),
                    ),
                ));
            }
        }
        self.services.delete_owned(Kind::Workflow, &k).await?;
        let (t, w) = super::operation(doc, key, worker, run);
        self.services.put_owned(t).await?;
        self.services.put_owned(w).await?;
        Ok(())
    }

    /// The cleaning's Template and Workflow gone (when they are ours).
    async fn remove_operation(&self, key: &Key) -> Result<(), crate::services::Error> {
        let k = super::key(key);
        if let Some(w) = self.store.workflow(&k).await?
            && super::ours(&w.doc)
        {
            self.services.delete_owned(Kind::Workflow, &k).await?;
        }
        if let Some(t) = self.store.template(&k).await?
            && super::ours(&t)
        {
            self.services.delete_owned(Kind::Template, &k).await?;
        }
        Ok(())
    }

    /// Where run `run`'s Workflow is.
    async fn workflow(&self, key: &Key, run: &str) -> Result<Run, crate::services::Error> {
        Ok(self
            .store
            .workflow(&super::key(key))
            .await?
            .map_or(Run::None, |w| w.run(super::RUN, run)))
    }
}

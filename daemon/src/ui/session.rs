//! The web UI's sessions: a login with the admin token makes one, named
//! by a random 128-bit id in an HttpOnly cookie, with its own CSRF token
//! that every action sends back. In memory: a restart logs everyone out,
//! which is what an appliance's admin expects of a token change too.
//! Bounded: past [`MAX`] sessions the oldest goes.

use std::collections::HashMap;
use std::sync::Mutex;

/// Sessions kept at most (a login beyond it ends the oldest).
pub const MAX: usize = 256;
/// A session lasts this long from its login.
pub const TTL_MS: i64 = 12 * 3600 * 1000;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    pub csrf: String,
    pub created_ms: i64,
}

#[derive(Default)]
pub struct Sessions {
    map: Mutex<HashMap<String, Session>>,
}

/// 128 random bits, hex.
pub fn random_id() -> Option<String> {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).ok()?;
    Some(hex::encode(b))
}

impl Sessions {
    /// A new session (its id, its CSRF token), at `now_ms`. None without
    /// OS randomness (never on Linux): no session is better than a
    /// guessable one.
    pub fn create(&self, now_ms: i64) -> Option<(String, Session)> {
        let id = random_id()?;
        let s = Session {
            csrf: random_id()?,
            created_ms: now_ms,
        };
        let mut m = self.map.lock().unwrap_or_else(|e| e.into_inner());
        m.retain(|_, v| now_ms - v.created_ms < TTL_MS);
        while m.len() >= MAX {
            let Some(oldest) = m
                .iter()
                .min_by_key(|(_, v)| v.created_ms)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            m.remove(&oldest);
        }
        m.insert(id.clone(), s.clone());
        Some((id, s))
    }

    /// The live session `id` names.
    pub fn get(&self, id: &str, now_ms: i64) -> Option<Session> {
        let m = self.map.lock().unwrap_or_else(|e| e.into_inner());
        m.get(id)
            .filter(|s| now_ms - s.created_ms < TTL_MS)
            .cloned()
    }

    pub fn remove(&self, id: &str) {
        self.map
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_expire_are_bounded_and_end_at_logout() {
        let s = Sessions::default();
        let (a, sa) = s.create(0).unwrap();
        assert_eq!(a.len(), 32);
        assert_ne!(a, sa.csrf);
        assert_eq!(s.get(&a, 1).unwrap().csrf, sa.csrf);
        assert!(s.get(&a, TTL_MS).is_none());
        assert!(s.get("nope", 1).is_none());
        s.remove(&a);
        assert!(s.get(&a, 1).is_none());
        let first = s.create(1).unwrap().0;
        for t in 2..(MAX as i64 + 2) {
            s.create(t).unwrap();
        }
        assert!(s.get(&first, MAX as i64 + 2).is_none(), "the oldest went");
        assert_eq!(s.map.lock().unwrap().len(), MAX);
    }
}

//! LISTEN, UNLISTEN and NOTIFY in a session.
//!
//! The session subscribes to channels on the engine's [`notify::Hub`]
//! through one [`notify::Dispatcher`], started at the first LISTEN and
//! stopped (with the stream followers it runs) when the session stops
//! listening to everything or ends. `LISTEN s` on a stream also hears each
//! row committed to it (see [`crate::notify`]). NOTIFY inside a block is
//! held until COMMIT ([`super::udfs::NotifyState`]); ROLLBACK drops it.

use super::{Output, Session};
use crate::error::{sqlstate, Error, Result};
use crate::notify;

impl Session {
    pub(super) fn listen(&mut self, channel: &str) -> Result<Output> {
        if !self.listeners.contains(channel) {
            let dispatcher = self.dispatcher.get_or_insert_with(|| {
                notify::Dispatcher::start(self.engine.catalog.clone(), self.notify_tx.clone())
            });
            self.engine
                .hub
                .subscribe(channel, self.id, dispatcher.inbox.clone());
            if let Some(stream) = self.engine.catalog.get(channel) {
                let from = stream.log.next_offset();
                dispatcher.control(notify::Control::Follow { stream, from });
            }
            self.listeners.insert(channel.to_string());
        }
        Ok(Output::Tag("LISTEN".into()))
    }

    /// `UNLISTEN channel`, or `UNLISTEN *` (`None`).
    pub(super) fn unlisten(&mut self, channel: Option<&str>) -> Result<Output> {
        match channel {
            Some(c) => {
                self.engine.hub.unsubscribe(c, self.id);
                if self.listeners.remove(c) {
                    if let Some(d) = &self.dispatcher {
                        d.control(notify::Control::Unfollow(c.to_string()));
                    }
                }
            }
            None => self.unlisten_all(),
        }
        Ok(Output::Tag("UNLISTEN".into()))
    }

    pub(super) fn unlisten_all(&mut self) {
        self.engine.hub.unsubscribe_all(self.id);
        self.listeners.clear();
        // dropping the dispatcher stops it and its stream followers
        self.dispatcher = None;
    }

    pub(super) fn notify_channel(&mut self, channel: &str, payload: &str) -> Result<Output> {
        if payload.len() >= notify::MAX_PAYLOAD {
            return Err(Error::new(
                sqlstate::INVALID_PARAMETER_VALUE,
                "payload string too long",
            ));
        }
        self.notify.send(channel.to_string(), payload.to_string());
        Ok(Output::Tag("NOTIFY".into()))
    }
}

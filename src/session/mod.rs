//! Sessions: the dsh-compatible JSONL log format, the store that writes, repairs and reads it,
//! and the in-memory live session the agent loop appends to.

pub mod catalog_index;
pub mod chunk;
pub mod data;
pub mod descriptor;
pub mod event;
pub mod inbox;
pub mod layout;
pub mod live;
pub mod query;
pub mod record;
pub mod repair;
mod resident;
pub mod scan;
pub mod store;
pub mod surface;
mod warn;
pub mod writer;

pub use data::Data;
pub use event::{EventBody, Kind, Payload};
pub use live::{Session, SessionObserver, now_ms};
pub use record::{Event, Record, SessionHeader};
pub use scan::{ScanError, Scanned, TornTail};
pub use store::{SessionStore, StoreError, StoredSession, Titles};
pub use surface::derive_messages;

//! Object storage for zerohop: S3-compatible stores (AWS S3, Ceph RGW,
//! MinIO and others) as a source of loads (local files are the engine's
//! own; `zerohop-names` opens each name where it lives), a sink of
//! the engine's writes, and a store of checkpoints
//! ([`S3CheckpointStore`]).
//!
//! An object opens as a [`zerohop::storage::SourceFile`] whose reads are
//! ranged GETs ([`open_objects`]): the engine reads it into its staging
//! slots as it reads a local file, so host memory stays within staging
//! whatever the object's size; a worker reads a run of consecutive windows
//! from one response, so requests stay large. Every request carries the
//! ETag seen when the object was opened (`If-Match`): an object replaced
//! meanwhile is an error, never mixed bytes. Configuration comes from the environment and the AWS
//! files, as AWS tools read them ([`S3Config::from_env`]).
#![forbid(unsafe_code)]

mod checkpoints;
mod client;
mod config;
pub mod ini;
mod location;
mod multipart;
mod range;
mod retry;
mod sink;
mod source;

pub use checkpoints::{
    checkpoint_location, checkpoint_location_with, checkpoint_store, S3CheckpointStore,
};
pub use client::{error_field, ObjectEntry, ObjectInfo, S3Client};
pub use config::{AddressingStyle, S3Config};
pub use location::S3Url;
pub use multipart::{MultipartUpload, MAX_PARTS, MIN_PART_BYTES};
pub use retry::RetryPolicy;
pub use sink::{config_for_uploads, create_object, UPLOAD_SLOT_BYTES};
pub use source::{expand_objects, expand_objects_with, head, open_objects, open_objects_with};

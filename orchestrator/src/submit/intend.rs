//! `submit`'s fourth stage, for each array in turn: its files on the
//! cluster, then the intent to submit it, in the state directory before
//! `sbatch` runs (`submission.json`, fsynced: the one durable write the
//! submission protocol needs; the journal line and the records follow from
//! it). Nothing is submitted twice: until SLURM answers (with a job id, or
//! by job name) the intent holds its configs.

use std::path::Path;

use super::arrays::Prepared;
use super::judge::Site;
use super::{blocking, CommandError};
use crate::fsio;
use crate::state::{Change, Submission};
use crate::util::failpoint;

/// Uploads `p`'s files (a fresh path per submission: nothing to clobber;
/// none where the `local` cluster reads them where they were rendered) and
/// records the intent to submit it: the submission `sbatch` is asked for.
pub(crate) async fn record_intent(mut p: Prepared, site: &mut Site) -> Result<Submission, CommandError> {
    if !site.is_local() || !same_file(&p.script_local, &p.sub.remote_script) {
        for (path, data) in std::mem::take(&mut p.files) {
            blocking(&site.target.transport, move |t| t.files().put_file(&path, &data, false)).await?;
        }
    }
    // The records' attempts follow from the intent (`StateDir::repair`), so they are written without fsync.
    p.sub.intended_at = fsio::now();
    failpoint::hit("intent:before");
    site.st.apply(Change::Intent { submission: p.sub.clone() })?;
    Ok(p.sub)
}

fn same_file(local: &Path, remote: &str) -> bool {
    std::path::absolute(local).map(|p| p == Path::new(remote)).unwrap_or(false)
}

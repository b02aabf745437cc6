-- Argo CD health check for multislice.dev/MultisliceJob (resource.customizations.health).
-- Maps status.phase, written by the operator only, to an Argo CD health status; the operator's
-- one-line status.message explains it.
local hs = {}
if obj.status == nil or obj.status.phase == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to pick up the job"
  return hs
end
local generation = obj.metadata and obj.metadata.generation
local observed = obj.status.observedGeneration
if generation ~= nil and observed ~= nil and observed < generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe generation " .. tostring(generation)
  return hs
end
local phase = obj.status.phase
local health = {
  Running = "Healthy",
  Succeeded = "Healthy",
  Pending = "Progressing",
  Queued = "Progressing", -- waiting in Kueue for quota (status.queue says where and why)
  Provisioning = "Progressing",
  Starting = "Progressing",
  Restarting = "Progressing",
  Failed = "Degraded",
  Suspended = "Suspended",
}
hs.status = health[phase] or "Unknown"
-- An elastic job running on fewer slices than spec.slices (condition Degraded=True, reason
-- FewerSlices: lost slices that cannot come back soon, a stockout or spec.elastic.waitSeconds
-- passed) is Degraded, as a Deployment past its progress deadline is. Only a running job's
-- health changes.
if hs.status == "Healthy" and phase == "Running" and obj.status.conditions ~= nil then
  for _, c in ipairs(obj.status.conditions) do
    if c.type == "Degraded" and c.status == "True" then
      hs.status = "Degraded"
      hs.message = phase .. ": " .. tostring(c.reason) .. ": " .. tostring(c.message or "")
      return hs
    end
  end
end
if obj.status.message ~= nil and obj.status.message ~= "" then
  hs.message = phase .. ": " .. obj.status.message
else
  hs.message = phase
end
return hs

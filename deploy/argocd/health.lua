-- Argo CD health check for kvcluster.io/KVCluster. Argo CD has none for a custom resource unless
-- configured; see argocd-cm.yaml beside this file for where it goes.
local hs = {}
if obj.metadata.deletionTimestamp ~= nil then
  hs.status = "Progressing"
  hs.message = "Deleting"
  return hs
end
if obj.status == nil or obj.status.observedGeneration == nil or obj.status.observedGeneration < obj.metadata.generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe the latest spec"
  return hs
end
local ready = nil
if obj.status.conditions ~= nil then
  for _, c in ipairs(obj.status.conditions) do
    if c.type == "Stalled" and c.status == "True" then
      hs.status = "Degraded"
      hs.message = c.message
      return hs
    end
    if c.type == "Ready" then
      ready = c
    end
  end
end
if ready == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to report readiness"
elseif ready.status == "True" then
  hs.status = "Healthy"
  hs.message = ready.message
elseif obj.status.phase == "Ready" then
  -- Formed once, now missing members: the operator is waiting for them to come back.
  hs.status = "Degraded"
  hs.message = ready.message
else
  hs.status = "Progressing"
  hs.message = ready.message
end
return hs
